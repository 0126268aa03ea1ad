"""The ``--processes`` parent's endpoint with a token: it enforces it, and sends it to its
children, which enforce it too. They get it over a pipe, not in their environment; the
group has one web gate, the parent's. The children are real workers, each on a memory
broker of its own (the group's supervision does not care which broker they use)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from flowkit.runtime.processes.group import ProcessGroup
from flowkit.runtime.processes.web import GroupWebServer
from flowkit.runtime.web.access import TOKEN_VAR

TOKEN = "group-token-5e1d0c9b"


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, children first."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *descendants(int(child))]
    return found


def environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def gates(pid: int) -> list[int]:
    """The web gates among ``pid``'s children."""
    gate = b"/runtime/web/gate/__main__.py"
    own = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
           for child in (task / "children").read_text().split()]  # fmt: skip
    return [child for child in own if gate in Path(f"/proc/{child}/cmdline").read_bytes()]


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as response:
        return response.status, await response.text()


async def test_the_parent_enforces_the_token_and_its_children_get_it() -> None:
    argv = [sys.executable, "-m", "flowkit.cli", "worker", "tests.ops.cli_app:app"]
    argv += ["--web-port", "0", "--broker", "memory://", "--log-level", "warning"]
    env = {**os.environ}
    env.pop(TOKEN_VAR, None)
    async with ProcessGroup(argv, 2, env=env, secrets={TOKEN_VAR: TOKEN}) as group:
        running = asyncio.create_task(group.run())
        web = GroupWebServer(group, "127.0.0.1", 0, token=TOKEN)
        await web.start()
        try:
            right = {"Authorization": f"Bearer {TOKEN}"}
            async with asyncio.timeout(60):
                while (await get(web.url + "/ready"))[0] != 200:
                    await asyncio.sleep(0.1)
            urls = [child.url() for child in group.children]
            assert all(urls)
            pids = [child.pid for child in group.children]
            for pid in pids:  # the token reached them, but not through their environment
                assert pid is not None
                for process in [pid, *descendants(pid)]:
                    assert TOKEN.encode() not in environ(process), process
                assert gates(pid) == []  # the parent's gate is the group's
            assert len(gates(os.getpid())) == 1
            for url in urls:  # the children want the token too
                assert (await get(f"{url}/metrics"))[0] == 401
                assert (await get(f"{url}/metrics", right))[0] == 200
            for route in ("/metrics", "/tables", "/tables/counts/ann"):
                assert (await get(web.url + route))[0] == 401, route
                wrong = {"Authorization": "Bearer nope"}
                assert (await get(web.url + route, wrong))[0] == 401, route
            status, text = await get(web.url + "/metrics", right)
            # the children's own series reached the parent: it asked them with the token
            assert status == 200 and "flowkit_records_in_total" in text
            status, text = await get(web.url + "/tables", right)
            assert status == 200 and '"counts"' in text
            status, text = await get(web.url + "/tables/counts/ann", right)
            assert status == 404 and "no key" in text  # the child's answer, not a 401
            assert (await get(web.url + "/health"))[0] == 200
            assert (await get(web.url + "/metrics", {**right, "Host": "evil.example"}))[0] == 421
        finally:
            await web.aclose()
            group.stop()
            await asyncio.wait_for(running, 60)
