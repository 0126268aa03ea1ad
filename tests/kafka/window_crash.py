"""What the kill -9 tests of windowed tables share (tests/kafka/test_session_crash.py,
test_sliding_crash.py, test_tumbling_disk_crash.py): users' hits on a topic, a worker
killed with SIGKILL once a quarter is committed and its changelog holds open windows, a
second worker that goes on until every expected window is out, and the checks of what
came out.

Every expected window comes out, and no other; twice only as a marked replay; its sum is
exact but for the at-least-once replay (a hit after the last commit may count twice in a
window still open at the kill); a dead letter is only a replayed hit whose window had
closed since (``LateRecord``); and at the end the changelog holds nothing of any user,
only of the hits an hour ahead that closed every window.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable

import msgspec
import pytest

from flowkit.partitioning import partition_for_key
from flowkit.records import Message
from flowkit.transports import TopicSpec
from tests.kafka.conftest import Client, Spawn, WorkerProcess, latest_by_key, until
from tests.kafka.disk_crash import start_on_disk

Hit = tuple[str, int, int]  # user, event time (ms), n
Window = tuple[str, int, int]  # user, start, end
Result = tuple[str, int, int, int]  # user, start, end, sum
REPLAYED = "flowkit.replayed"


def flush_hits(t0: int, partitions: int) -> list[Hit]:
    """A hit per partition an hour ahead: it closes and expires every window."""
    flush: dict[int, Hit] = {}
    for i in range(1000):
        p = partition_for_key(f"f{i}".encode(), partitions)
        flush.setdefault(p, (f"f{i}", t0 + 3_600_000, 1))
    return list(flush.values())


def result(m: Message) -> Result:
    r = msgspec.json.decode(m.value or b"{}")
    return (r["key"], r["start"], r["end"], r["value"])


class Run:
    """One test's app: its name (the group), its topics, and the changelog key kinds
    that hold open windows (``open``) and that belong to a key (``kept``)."""

    def __init__(
        self,
        app: str,
        group: str,
        hits: str,
        out: str,
        changelog: str,
        partitions: int,
        *,
        open_kinds: Iterable[bytes],
        key_kinds: Iterable[bytes],
        known_leftover: str | None = None,
    ) -> None:
        self.app, self.group, self.hits, self.out = app, group, hits, out
        self.changelog, self.partitions = changelog, partitions
        self.open_kinds, self.key_kinds = tuple(open_kinds), tuple(key_kinds)
        self.second_err = ""
        # A known bug that leaves a user's record in the changelog (the check says which).
        self.known_leftover = known_leftover

    async def windows_open(self, client: Client) -> bool:
        held = latest_by_key(await client.read(self.changelog, self.partitions))
        return any(k[:5] in self.open_kinds and v for k, v in held.items())

    async def kill_and_restart(
        self,
        client: Client,
        workers: Spawn,
        url: str,
        hits: list[Hit],
        expected: set[Window],
        data_dir: str | None = None,
    ) -> tuple[list[Message], set[int], dict[int, int]]:
        """Produce ``hits``, kill the first worker mid-run with windows open, and let a
        second one go on until ``expected`` is out (or 60 s), then stop it: the outputs,
        the indexes of the hits read again, and the committed offsets at the kill. Both
        workers keep local state in ``data_dir``, if given; ``second_err`` keeps the
        second one's log."""

        def start_worker(workers: Spawn, name: str, app: str, url: str) -> WorkerProcess:
            if data_dir:
                return start_on_disk(workers, name, app, url, data_dir)
            return workers(name, "worker", app, "--broker", url, "-l", "info")

        await client.transport.create_topics([TopicSpec(self.hits, self.partitions)])
        encode = msgspec.json.encode
        acks = await client.produce(
            self.hits, [(u.encode(), encode({"user": u, "t": t, "n": n}), t) for u, t, n in hits]
        )
        first = start_worker(workers, f"{self.group}-1", self.app, url)
        committed: dict[int, int] = {}

        async def progress() -> None:
            committed.update(await client.committed(self.group, self.hits, self.partitions))

        deadline = time.monotonic() + 30
        while sum(committed.values()) < len(hits) // 4 or not await self.windows_open(client):
            assert time.monotonic() < deadline, f"too little done in 30 s:\n{first.err}"
            assert first.running(), first.err
            await progress()
            await asyncio.sleep(0.05)
        first.kill()
        assert first.popen.returncode == -9
        await progress()
        assert sum(committed.values()) < len(hits) - self.partitions, committed  # mid-run
        assert await self.windows_open(client)  # windows were open when it died
        # The hits after the last commit are read again: at-least-once, those whose effect
        # reached the changelog count twice in a window still open then.
        again = {i for i, a in enumerate(acks) if a.offset >= committed[a.partition]}

        second = start_worker(workers, f"{self.group}-2", self.app, url)
        deadline = time.monotonic() + 60
        while not expected <= {result(m)[:3] for m in await self.outputs(client)}:
            if time.monotonic() > deadline or not second.running():
                break  # the comparison of the checks says what is missing
            await asyncio.sleep(0.2)
        await until(lambda: "tables recovered" in second.err, 10, "the second worker's recovery")
        assert await second.stop() == 0, second.err
        self.second_err = second.err
        return await self.outputs(client), again, committed

    async def outputs(self, client: Client) -> list[Message]:
        return [m for m in await client.read(self.out, self.partitions) if m.value]

    async def check(
        self,
        client: Client,
        out: list[Message],
        expected: dict[Window, list[int]],
        hits: list[Hit],
        again: set[int],
        committed: dict[int, int],
    ) -> None:
        """The checks of the module docstring; ``expected`` maps each window to the
        indexes of its hits."""
        counted = Counter(result(m) for m in out)
        seen = Counter(r[:3] for r in counted.elements())
        assert set(seen) == set(expected), (
            sorted(set(expected) - set(seen))[:10],
            sorted(set(seen) - set(expected))[:10],
        )
        replayed = {result(m) for m in out if (REPLAYED, b"true") in m.headers}
        assert all(n == 1 or (n == 2 and r in replayed) for r, n in counted.items()), counted
        for user, start, end, value in counted:
            members = expected[user, start, end]
            exact = sum(hits[i][2] for i in members)
            twice = sum(hits[i][2] for i in members if i in again)
            assert exact <= value <= exact + twice, (user, start, end, value, exact, twice)
        for letter in await client.read(f"{self.group}-dlq", 1):
            headers = dict(letter.headers)
            assert headers["flowkit.error.type"] == b"LateRecord", headers
            p = int(headers["flowkit.source.partition"])
            assert int(headers["flowkit.source.offset"]) >= committed[p], headers
        left = latest_by_key(await client.read(self.changelog, self.partitions))
        kept = [k for k, v in left.items() if v and k[:5] in self.key_kinds]
        users = [k for k in kept if b'"f' not in k]  # only the hits an hour ahead stay
        if users and self.known_leftover:
            pytest.xfail(f"{self.known_leftover}: {users[:5]}")
        assert not users, kept
