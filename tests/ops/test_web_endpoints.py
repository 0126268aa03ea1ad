"""Which worker holds a key: only signed adverts are believed, and a lookup costs no broker I/O."""

from __future__ import annotations

import asyncio
import resource
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from flowkit.errors import FlowkitError
from flowkit.records import Headers, Message
from flowkit.runtime.web.endpoints import (
    SECRET_VAR,
    BadAdvert,
    EndpointDirectory,
    advert_value,
    check_advert,
    check_url,
    signed_headers,
)
from flowkit.runtime.web.limits import WebLimits
from flowkit.runtime.web.server import WebServer
from flowkit.runtime.web.tables import endpoints_topic
from flowkit.testing import TestDriver
from flowkit.transports import MemoryTransport
from tests.conftest import APACHE_KAFKA, DriverFactory
from tests.ops.webapp import Click, build

SECRET = b"the group's secret"
USERS = [f"u{i}" for i in range(12)]


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_VAR, SECRET.decode())


async def status_of(url: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, allow_redirects=False) as response,
    ):
        return response.status, response.headers.get("Location", "")


async def split(one: TestDriver, two: TestDriver) -> tuple[WebServer, WebServer, list[int]]:
    """Wait until the two workers split the partitions and each knows the other's; returns
    their web servers and the partitions the second holds."""
    web_one, web_two = one.worker.web, two.worker.web
    assert web_one is not None and web_two is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20.0
    while loop.time() < deadline:
        held = web_one.tables.held(), web_two.tables.held()
        directory = web_one.tables.directory
        if (
            all(held)
            and sorted(held[0] + held[1]) == [0, 1, 2, 3]
            and directory is not None
            and directory.owners() == dict.fromkeys(held[1], web_two.url)
        ):
            return web_one, web_two, held[1]
        await asyncio.sleep(0.02)
    pytest.fail(f"the partitions were not split and advertised within 20 s: {held}")


async def started(
    make_driver: DriverFactory, name: str, **options: Any
) -> tuple[TestDriver, TestDriver]:
    app = build(name, partitions=4)
    one, two = make_driver(app, web_port=0, **options), make_driver(app, web_port=0, **options)
    await one.__aenter__()
    await two.__aenter__()
    for user in USERS:
        await one.send(app.topics["clicks"], Click(user), key=user)
    await one.run_until_idle()
    await two.run_until_idle()
    return one, two


@pytest.mark.parametrize(
    "make_driver",
    ["memory", pytest.param("kafka", marks=pytest.mark.kafka), *APACHE_KAFKA],
    indirect=True,
)
async def test_forged_and_malformed_adverts_are_passed_over(make_driver: DriverFactory) -> None:
    one, two = await started(make_driver, "webforged")
    try:
        web_one, web_two, theirs = await split(one, two)
        directory = web_one.tables.directory
        assert directory is not None
        topic = endpoints_topic("webforged")
        evil = "http://169.254.169.254:80"
        everything = advert_value(evil, [0, 1, 2, 3], at=1e18)

        def signed(key: bytes, value: bytes, secret: bytes = SECRET) -> dict[str, object]:
            return {"key": key, "headers": signed_headers(secret, topic, key, value)}

        hostile: list[tuple[bytes | None, dict[str, object]]] = [
            (everything, {"key": evil.encode()}),  # not signed
            (everything, signed(evil.encode(), everything, b"a guess")),
            (everything, signed(evil.encode(), everything) | {"key": b"http://other:1"}),
            (b"\xff not json", {"key": evil.encode()}),
            (b"\xff not json", signed(evil.encode(), b"\xff not json")),
            (b"[[[[", signed(evil.encode(), b"[[[[")),
            (None, {"key": web_two.url.encode()}),  # a tombstone does not remove an owner
            (everything, signed(b"", everything) | {"key": None}),
            # Signed, so from a worker of the group, but no URL to redirect anyone to.
            *(
                (
                    advert_value(url, [0, 1, 2, 3], at=1e18),
                    signed(url.encode(), advert_value(url, [0, 1, 2, 3], at=1e18)),
                )
                for url in (
                    "http://169.254.169.254:80/latest/meta-data",
                    "file://localhost:1",
                    "http://user@evil:80",
                    "http://evil:80\r\nSet-Cookie: a=b",
                    "http://evil:0",
                    "http://evil:99999",
                    "http://evil",
                )
            ),
            # An old advert of the second worker, written again, changes nothing.
            (
                advert_value(web_two.url, [], at=1.0),
                signed(web_two.url.encode(), advert_value(web_two.url, [], at=1.0)),
            ),
        ]
        skipped, sent = directory.skipped, 0
        for value, options in hostile:
            try:  # one at a time: a record the broker refuses takes no other with it
                await (await one.send_raw(topic, value, **options))  # type: ignore[arg-type]
            except FlowkitError:
                # Apache Kafka refuses a record without a key on a compacted topic.
                assert options["key"] is None and one.worker.transport.url.startswith("kafka")
                continue
            sent += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20.0
        while directory.skipped < skipped + sent and loop.time() < deadline:
            await asyncio.sleep(0.02)
        assert directory.skipped == skipped + sent
        assert directory.owners() == dict.fromkeys(theirs, web_two.url)
        table = build("x", partitions=4).tables["counts"]
        for user in USERS:
            status, location = await status_of(f"{web_one.url}/tables/counts/{user}")
            if table.partition_of(user) in theirs:
                assert (status, location) == (307, f"{web_two.url}/tables/counts/{user}")
            else:
                assert status == 200
    finally:
        await two.__aexit__(None, None, None)
        await one.__aexit__(None, None, None)


def _connections_to(port: int) -> int:
    """Established TCP connections from this machine to ``port`` (the broker's)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01":
                count += 1
    return count


@pytest.mark.parametrize(
    "make_driver",
    [
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("rdkafka", marks=pytest.mark.kafka),
    ],
    indirect=True,
)
async def test_remote_lookups_open_no_broker_connections(make_driver: DriverFactory) -> None:
    # Limits that let 300 lookups in at once: what is counted here is broker connections.
    # (The endpoint takes at most a quarter of the file descriptors the process may open.)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2048 if hard == resource.RLIM_INFINITY else min(hard, 2048)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    limits = WebLimits(max_connections=400, rate=10_000.0, burst=400, concurrency=300)
    one, two = await started(make_driver, "webconnections", web_limits=limits)
    try:
        web_one, _, theirs = await split(one, two)
        port = urlsplit(one.worker.transport.url.replace("kafka://", "tcp://")).port
        assert port is not None
        table = build("x", partitions=4).tables["counts"]
        remote = [u for u in USERS if table.partition_of(u) in theirs]
        before = _connections_to(port)
        most = before
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, _connections_to(port))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        connector = aiohttp.TCPConnector(limit=300)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def lookup(i: int) -> int:
                url = f"{web_one.url}/tables/counts/{remote[i % len(remote)]}"
                async with http.get(url, allow_redirects=False) as response:
                    return response.status

            statuses = await asyncio.gather(*(lookup(i) for i in range(300)))
        done.set()
        await watcher
        assert statuses == [307] * 300
        assert (most, _connections_to(port)) == (before, before)
    finally:
        await two.__aexit__(None, None, None)
        await one.__aexit__(None, None, None)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_without_a_secret_nothing_is_advertised_or_believed(
    make_driver: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_VAR)
    one, two = await started(make_driver, "webnosecret")
    try:
        web_one = one.worker.web
        assert web_one is not None and web_one.tables.directory is None
        table = build("x", partitions=4).tables["counts"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20.0
        while loop.time() < deadline:
            theirs = set(range(4)) - set(web_one.tables.held())
            if theirs and web_one.tables.held():
                break
            await asyncio.sleep(0.02)
        user = next(u for u in USERS if table.partition_of(u) in theirs)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{web_one.url}/tables/counts/{user}", allow_redirects=False) as response,
        ):
            body = await response.json()
        assert response.status == 404 and SECRET_VAR in body["error"]
    finally:
        await two.__aexit__(None, None, None)
        await one.__aexit__(None, None, None)


def test_only_plain_http_urls_are_advertised() -> None:
    assert check_url("http://127.0.0.1:9100") == "http://127.0.0.1:9100"
    assert check_url("https://[::1]:443") == "https://[::1]:443"


def message(offset: int, key: bytes | None, value: bytes | None, headers: Headers = ()) -> Message:
    return Message("app-web-endpoints", 0, offset, 0, key, value, headers)


async def test_records_passed_over_log_one_line_per_reason() -> None:
    async with MemoryTransport() as transport:
        directory = EndpointDirectory(transport, "app-web-endpoints", SECRET, "http://me:1")
        flood = [message(i, b"http://x:1", b"{}") for i in range(500)]
        flood += [message(500 + i, b"http://x:1", None) for i in range(500)]
        with capture_logs() as logs:
            directory.apply(flood)
        assert directory.skipped == 1_000 and directory.owners() == {}
        assert [(line["reason"], line["offset"]) for line in logs] == [
            ("not signed", 0),
            ("a tombstone", 500),
        ]


URLS = st.from_regex(r"(https?|ftp|)://[a-z0-9.\-\[\]:@/ \r\n]{0,20}(:[0-9]{0,6})?", fullmatch=True)


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes | None, bytes | None]:
    """A key and value: bytes, or an advert of some URL keyed by it (or by other bytes)."""
    if draw(st.booleans()):
        return draw(st.none() | st.binary(max_size=40)), draw(st.none() | st.binary(max_size=80))
    url = draw(URLS | st.text(max_size=30))
    partitions = draw(st.lists(st.integers(-3, 3), max_size=4))
    value = advert_value(url, partitions, at=draw(st.floats()))
    return draw(st.just(url.encode()) | st.binary(max_size=10)), value


@settings(max_examples=500, deadline=None)
@given(record=records(), signature=st.none() | st.binary(max_size=70), sign=st.booleans())
def test_any_record_is_an_advert_with_a_good_url_or_passed_over(
    record: tuple[bytes | None, bytes | None], signature: bytes | None, sign: bool
) -> None:
    # Signed or not, whatever a record holds never raises anything but BadAdvert, and what
    # is believed names a plain http(s)://host:port, its own key.
    key, value = record
    topic = "app-web-endpoints"
    headers: Headers = (("flowkit-signature", signature),)
    if sign and key is not None and value is not None:
        headers = signed_headers(SECRET, topic, key, value)
    try:
        advert = check_advert(SECRET, topic, key, value, headers)
    except BadAdvert:
        return
    assert sign and check_url(advert.url) == advert.url and key == advert.url.encode()
    assert "\r" not in advert.url and "\n" not in advert.url and "@" not in advert.url


async def test_an_endpoint_others_could_not_take_is_not_advertised() -> None:
    # Listening on "::" makes the URL http://:::PORT, which no other worker would believe.
    app = build("webipv6", partitions=2)
    with capture_logs() as logs:
        async with TestDriver(app, web_port=0, web_host="::") as driver:
            web = driver.worker.web
            assert web is not None and web.tables.directory is not None
            await driver.run_until_idle()
            assert web.tables.advertised is None
    assert [line["url"] for line in logs if "not advertising" in line["event"]] == [web.url]
