"""The ``--processes`` parent passes ``/tables`` reads to its children and follows no redirect
but one to another of its children.

The children here are stand-in HTTP servers on 127.0.0.1 (each registered under the pid of a
real ``sleep`` process, which is what makes a child count as running), and so is the
foreign host a child redirects to, which counts the requests it gets.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from flowkit.errors import ConfigurationError
from flowkit.runtime.processes.group import ProcessGroup
from flowkit.runtime.processes.web import GroupWebServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with ``handler``; yields its URL."""
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def get(url: str) -> tuple[int, str, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, allow_redirects=False) as response,
    ):
        return response.status, response.headers.get("Location", ""), await response.read()


async def test_the_parent_follows_no_redirect_to_a_foreign_host() -> None:
    foreign_hits: list[str] = []
    urls: dict[str, str] = {}

    async def foreign(request: web.Request) -> web.Response:
        foreign_hits.append(request.path_qs)
        return web.Response(text="the metadata service's secrets")

    async def first(request: web.Request) -> web.Response:
        # /tables/t/a is held abroad, /tables/t/b by the second child.
        where = urls["foreign"] if request.path.endswith("/a") else urls["second"]
        raise web.HTTPTemporaryRedirect(f"{where}{request.path_qs}")

    async def second(request: web.Request) -> web.Response:
        if request.path.endswith("/c"):  # a second hop is not followed either
            raise web.HTTPTemporaryRedirect(f"{urls['first']}{request.path_qs}")
        return web.json_response({"value": 1, "from": "second"})

    sleepers = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
        for _ in range(2)
    ]
    try:
        async with (
            serving(foreign) as urls["foreign"],
            serving(first) as urls["first"],
            serving(second) as urls["second"],
            ProcessGroup(["true"], 2) as group,
        ):
            for child, sleeper, url in zip(
                group.children, sleepers, (urls["first"], urls["second"]), strict=True
            ):
                child.process = sleeper
                child.report.write_text(json.dumps({"url": url, "pid": sleeper.pid}))
            parent = GroupWebServer(group)
            await parent.start()
            try:
                status, location, _ = await get(f"{parent.url}/tables/t/a?at=1")
                assert (status, location) == (307, f"{urls['foreign']}/tables/t/a?at=1")
                status, _, body = await get(f"{parent.url}/tables/t/b")
                assert status == 200 and json.loads(body) == {"value": 1, "from": "second"}
                status, location, _ = await get(f"{parent.url}/tables/t/c")
                assert (status, location) == (307, f"{urls['first']}/tables/t/c")
            finally:
                await parent.aclose()
        assert foreign_hits == []
    finally:
        for sleeper in sleepers:  # the group stops its children itself; these if it did not
            if sleeper.returncode is None:
                sleeper.kill()
            await sleeper.wait()


async def test_a_port_in_use_is_one_line_naming_the_option_as_a_worker_says_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with ProcessGroup(["true"], 1) as group:
            parent = GroupWebServer(group, "127.0.0.1", port)
            with pytest.raises(
                ConfigurationError, match=rf"^--web-port {port}: the port is already in use"
            ):
                await parent.start()
            await parent.aclose()
