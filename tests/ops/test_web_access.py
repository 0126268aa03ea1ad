"""Who may read the web endpoint: the token on every route but the probes, and the Host
allow-list against DNS rebinding."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import aiohttp
import pytest
import structlog
import structlog.testing

from flowkit.errors import ConfigurationError
from flowkit.runtime.web.access import WebAccess, WebToken
from flowkit.testing import TestDriver
from tests.ops.webapp import Click, build

TOKEN = "tok-3f9a1c2e8b7d4e6f"
ROUTES = [
    "/",
    "/assets/page.js",
    "/metrics",
    "/status",
    "/graph",
    "/tables",
    "/tables/counts/ann",
    "/tables/per_window/ann",
    "/no/such/route",
]
PROBES = ["/health", "/ready"]


async def status_of(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers=headers or {}, allow_redirects=False) as response,
    ):
        return response.status, await response.text()


async def test_every_route_but_the_probes_needs_the_token() -> None:
    app = build("tokendemo")
    async with TestDriver(app, web_port=0, web_token=TOKEN) as driver:
        await driver.send(app.topics["clicks"], Click("ann"), key="ann")
        await driver.run_until_idle()
        web = driver.worker.web
        assert web is not None
        right = {"Authorization": f"Bearer {TOKEN}"}
        for route in ROUTES:
            assert (await status_of(web.url + route))[0] == 401, route
            wrong = {"Authorization": f"Bearer {TOKEN}x"}
            assert (await status_of(web.url + route, wrong))[0] == 401, route
            basic = {"Authorization": f"Basic {TOKEN}"}
            assert (await status_of(web.url + route, basic))[0] == 401, route
            expected = 404 if route == "/no/such/route" else 200
            assert (await status_of(web.url + route, right))[0] == expected, route
        for route in PROBES:
            assert (await status_of(web.url + route))[0] == 200, route
        # the page without the token is a 401 that asks for it, and names no data
        status, page = await status_of(web.url + "/")
        assert status == 401 and 'id="login"' in page and "tokendemo" not in page


async def test_without_a_token_every_route_answers() -> None:
    app = build("opendemo")
    async with TestDriver(app, web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        for route in ROUTES[:-1] + PROBES:
            status, _ = await status_of(web.url + route)
            assert status in (200, 404), route  # (404: a key nobody sent)


async def test_a_foreign_host_is_refused_on_a_loopback_bind() -> None:
    app = build("hostdemo")
    async with TestDriver(app, web_port=0, web_allowed_hosts=["flowkit.internal"]) as driver:
        web = driver.worker.web
        assert web is not None
        port = web.port
        for host in ("evil.example", "evil.example:80", f"attacker.test:{port}", "127.0.0.2"):
            for route in ("/status", "/metrics", "/graph", "/"):
                status, _ = await status_of(web.url + route, {"Host": host})
                assert status == 421, (host, route)
        for host in (
            f"localhost:{port}",
            f"127.0.0.1:{port}",
            f"[::1]:{port}",
            "LOCALHOST",
            f"flowkit.internal:{port}",
        ):
            assert (await status_of(web.url + "/status", {"Host": host}))[0] == 200, host
        # probes answer whatever the name: an orchestrator asks by the pod's address
        assert (await status_of(web.url + "/health", {"Host": "10.0.0.7:9100"}))[0] == 200


def test_the_host_list_on_other_binds() -> None:
    assert WebAccess("0.0.0.0").allowed is None  # no names given: any (the token guards)
    named = WebAccess("0.0.0.0", allowed_hosts=["worker-1.example"])
    assert named.host_allowed("worker-1.example:9100") and not named.host_allowed("evil")
    assert WebAccess("127.0.0.1", allowed_hosts=["*"]).allowed is None
    assert WebAccess("::1").host_allowed("[::1]:9100")
    assert not WebAccess("localhost").host_allowed("evil.example")


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "é-accent", "new\nline"])
def test_a_bad_token_is_one_line_that_does_not_quote_it(bad: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        WebToken(bad)
    assert str(caught.value) == "the web token must be printable ASCII without spaces"


async def test_the_token_appears_in_no_repr_log_or_error() -> None:
    app = build("secretdemo")
    out = io.StringIO()
    # The log lines are captured in place (structlog.testing.capture_logs changes the
    # configured processors list, which loggers cached earlier share): configuring
    # structlog anew here would leave those loggers writing elsewhere for the session.
    handler = logging.StreamHandler(out)
    logging.getLogger().addHandler(handler)
    try:
        with structlog.testing.capture_logs() as entries:
            async with TestDriver(app, web_port=0, web_token=TOKEN) as driver:
                web = driver.worker.web
                assert web is not None
                texts = [repr(web), str(web.access), repr(web.access.token), str(web.access.token)]
                # a malformed request carrying the token: aiohttp's report of it is logged
                reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
                bad = f"GET / HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\x01\r\n\r\n"
                writer.write(bad.encode())
                await writer.drain()
                await reader.read()
                writer.close()
                for route in ROUTES:
                    texts.append((await status_of(web.url + route))[1])
                    texts.append(
                        (await status_of(web.url + route, {"Authorization": "Bearer no"}))[1]
                    )
    finally:
        logging.getLogger().removeHandler(handler)
    logged = json.dumps(entries, default=str) + out.getvalue()
    texts.append(logged)
    assert "Error handling request" in logged
    assert not [text for text in texts if TOKEN in text]
