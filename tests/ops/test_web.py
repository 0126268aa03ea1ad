"""The worker's HTTP endpoint: health, readiness, metrics, graph, status and tables."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

import flowkit
from flowkit.errors import ConfigurationError
from flowkit.runtime.web.endpoints import SECRET_VAR, signed_headers
from flowkit.runtime.web.tables import endpoints_topic
from flowkit.testing import TestDriver
from tests.conftest import DriverFactory, WindowStores
from tests.ops.webapp import Click, build


async def get(url: str, **kwargs: object) -> tuple[int, dict[str, object] | str, str]:
    async with aiohttp.ClientSession() as http, http.get(url, **kwargs) as response:  # type: ignore[arg-type]
        ctype = response.headers.get("Content-Type", "")
        body = await (response.json() if "json" in ctype else response.text())
        return response.status, body, response.headers.get("Location", "")


async def test_endpoints_of_a_running_worker(window_store: WindowStores) -> None:
    app = build()  # its tables on each store: the same answers
    clicks = app.topics["clicks"]
    async with TestDriver(app, web_port=0) as driver:
        for user in ("ann", "bob", "ann"):
            await driver.send(clicks, Click(user), key=user)
        await driver.run_until_idle()
        web = driver.worker.web
        assert web is not None and web.host == "127.0.0.1"
        url = web.url
        assert (await get(f"{url}/health"))[:2] == (200, {"alive": True, "app": "webdemo"})
        assert (await get(f"{url}/ready"))[:2] == (200, {"ready": True, "app": "webdemo"})
        status, text, _ = await get(f"{url}/metrics")
        assert (
            status == 200
            and 'flowkit_consumer_lag_records{partition="0",topic="clicks"} 0.0' in str(text)
        )
        status, graph, _ = await get(f"{url}/graph")
        assert status == 200 and isinstance(graph, dict) and graph["app"] == "webdemo"
        status, figures, _ = await get(f"{url}/status")
        assert isinstance(figures, dict)
        assert figures["agents"] == {"count": {"records": 3, "outputs": 3}}
        assert figures["tables"]["counts"] == {"keys": 2}
        status, tables, _ = await get(f"{url}/tables")
        assert [t["name"] for t in tables["tables"]] == ["counts", "per_window"]  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/counts/ann")
        assert status == 200 and value["value"] == 2 and value["key"] == "ann"  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/counts/nobody")
        assert status == 404 and "no key 'nobody'" in value["error"]  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/nope/ann")
        assert status == 404 and "no table 'nope'" in value["error"]  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/per_window/ann")
        assert status == 200
        windows = value["windows"]  # type: ignore[index]
        assert [w["value"] for w in windows] == [2]
        start = windows[0]["start"]
        status, value, _ = await get(f"{url}/tables/per_window/ann", params={"at": str(start)})
        assert value["windows"] == windows  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/per_window/ann", params={"at": "1"})
        assert value["windows"] == []  # type: ignore[index]
        status, value, _ = await get(f"{url}/tables/per_window/ann", params={"at": "soon"})
        assert status == 400
        status, page, _ = await get(f"{url}/")
        assert status == 200 and "<script>" in str(page) and "sessionStorage" in str(page)
        assert (await get(f"{url}/assets/page.js"))[0] == 200
        assert (await get(f"{url}/assets/secret.py"))[0] == 404


async def test_a_key_held_by_another_worker_redirects_to_it(
    make_driver: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_VAR, "shared by the group")
    app = build("webowners", partitions=4)
    clicks = app.topics["clicks"]
    async with make_driver(app, web_port=0) as one, make_driver(app, web_port=0) as two:
        web_one, web_two = one.worker.web, two.worker.web
        assert web_one is not None and web_two is not None
        users = [f"u{i}" for i in range(12)]
        for user in users:
            await one.send(clicks, Click(user), key=user)
        await one.run_until_idle()
        await two.run_until_idle()
        for _ in range(300):  # the group split the partitions, and the first knows it
            held = web_one.tables.held(), web_two.tables.held()
            split = sorted(held[0] + held[1]) == [0, 1, 2, 3] and all(held)
            if split and web_one.tables.owners() == dict.fromkeys(held[1], web_two.url):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail(f"no split of the partitions advertised within 6 s: {held}")
        table = app.tables["counts"]
        theirs = next(u for u in users if table.partition_of(u) in held[1])
        status, _, location = await get(
            f"{web_one.url}/tables/counts/{theirs}", allow_redirects=False
        )
        assert status == 307 and location == f"{web_two.url}/tables/counts/{theirs}"
        status, value, _ = await get(f"{web_one.url}/tables/counts/{theirs}")
        assert status == 200 and value["value"] == 1  # type: ignore[index]
        mine = next(u for u in users if table.partition_of(u) in held[0])
        status, value, _ = await get(f"{web_one.url}/tables/counts/{mine}")
        assert status == 200 and value["value"] == 1  # type: ignore[index]


async def test_a_port_in_use_is_one_line_naming_the_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ConfigurationError, match=rf"^--web-port {port}: the port is already in use"
        ):
            async with TestDriver(build(), web_port=port):
                pass


async def test_a_bad_host_is_one_line_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"^--web-host '10\.255\.255\.1': not an address"):
        async with TestDriver(build(), web_port=0, web_host="10.255.255.1"):
            pass


async def test_health_and_readiness_fail_after_a_fatal_error() -> None:
    app = build("fataldemo")
    go = asyncio.Event()

    @app.task
    async def breaks() -> None:
        await go.wait()
        raise RuntimeError("the disk is full")

    driver = TestDriver(app, web_port=0)
    async with driver:
        web = driver.worker.web
        assert web is not None
        await driver.run_until_idle()
        assert (await get(f"{web.url}/health"))[0] == 200
        go.set()
        for _ in range(200):
            if driver.worker.error is not None:
                break
            await asyncio.sleep(0.01)
        status, body, _ = await get(f"{web.url}/health")
        assert status == 503 and body["alive"] is False  # type: ignore[index]
        assert "the disk is full" in body["error"]  # type: ignore[index]
        assert (await get(f"{web.url}/ready"))[0] == 503


async def test_hostile_keys_and_advertisements_are_answered_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A key nested deeper than msgspec decodes (RecursionError) is a bad request, and
    # advertisements that do not decode are passed over, not raised, even signed.
    secret = b"shared by the group"
    monkeypatch.setenv(SECRET_VAR, secret.decode())
    app = flowkit.App("webhostile", partitions=2)
    items = app.topic("items", value_type=int, key_type=Any)
    by_key = app.table("by_key", key_type=Any, default=int)

    @app.agent(items)
    async def keep(stream: flowkit.Stream[int]) -> None:
        async for n in stream:
            by_key[n] += 1

    async with TestDriver(app, web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        status, value, _ = await get(f"{web.url}/tables/by_key/{'[' * 2_000}")
        assert status == 400 and "is not a" in value["error"]  # type: ignore[index]
        topic = endpoints_topic(app.name)
        directory = web.tables.directory
        assert directory is not None
        adverts = [
            (b"\xff\xfe", b"{}"),
            (b"http://a:1", b"[" * 5_000),
            (b"http://b:1", b"\xff"),
            (b"http://c:1", b'"a string"'),
            (b"http://d:1", b'{"partitions": "all", "at": "now"}'),
            (b"http://e:1", b'{"partitions": [[0]], "at": 1}'),
            (b"http://f:1", b'{"url": "http://f:1", "partitions": [-1], "at": 1}'),
            (b"http://g:1", b'{"url": "http://g:1", "partitions": [1], "at": NaN}'),
            (b"http://h:1", b'{"url": "http://h:1", "partitions": [1], "at": 2.5}'),  # good
        ]
        for key, data in adverts:
            headers = signed_headers(secret, topic, key, data)
            await driver.send_raw(topic, data, key=key, headers=headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while not web.tables.owners() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert web.tables.owners() == {1: "http://h:1"}
        assert directory.skipped == len(adverts) - 1  # all but the last, none raised
