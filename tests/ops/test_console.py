"""The console: recovery progress (a bar on a terminal, log lines otherwise), status lines."""

from __future__ import annotations

import asyncio
import io

from flowkit.runtime.tables.recovery import RecoveryProgress
from flowkit.testing import TestDriver
from flowkit.transports import MemoryBroker
from tests.ops.webapp import Click, build


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_tables_recovering_draw_a_bar_on_a_terminal() -> None:
    app = build("consoledemo")
    clicks = app.topics["clicks"]
    broker = MemoryBroker()
    async with TestDriver(app, broker=broker) as first:
        for i in range(50):
            await first.send(clicks, Click(f"u{i}"), key=f"u{i}")
        await first.run_until_idle()
    second = TestDriver(app, broker=broker)
    terminal = Terminal()
    second.worker.console.stream = terminal
    async with second:
        await second.run_until_idle()
        recovery = second.worker.state.recovery
        assert recovery.done >= 50 and not recovery.active
    drawn = terminal.getvalue()
    assert "recovering tables [" in drawn and "records" in drawn
    assert drawn.endswith("\r")  # the bar is wiped when recovery ends


class Lines:
    """A logger that keeps what it is told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def info(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))

    warning = info


async def test_without_a_terminal_progress_is_log_lines() -> None:
    async with TestDriver(build("linesdemo")) as driver:
        console = driver.worker.console
        console.stream, console.log = io.StringIO(), Lines()  # type: ignore[assignment]
        recovery = RecoveryProgress()
        recovery.active, recovery.read, recovery.left = True, 10, 30
        console.progress(recovery)
        console.progress(recovery)  # within 2 s of the last line: not repeated
    assert console.log.lines == [  # type: ignore[attr-defined]
        ("recovering tables", {"records": 10, "total": 40, "rate": 0})
    ]
    assert console.stream.getvalue() == ""


async def test_the_status_line_gives_rate_lag_and_partitions() -> None:
    app = build("statusdemo")
    clicks = app.topics["clicks"]
    async with TestDriver(app) as driver:
        for i in range(5):
            await driver.send(clicks, Click(f"u{i}"), key=f"u{i}")
        await driver.run_until_idle()
        line = driver.worker.console.status_line()
        assert line["lag"] == 0
        assert line["partitions"] == 4  # clicks and the windowed table's repartition topic
        assert line["records_per_s"] > 0
        assert driver.worker.console.status_line()["records_per_s"] == 0


async def test_a_worker_on_the_embedded_broker_says_once_why_no_record_comes() -> None:
    driver = TestDriver(build("idledemo"), idle_hint=0.05)
    driver.worker.console.log = lines = Lines()  # type: ignore[assignment]
    async with driver:
        await asyncio.sleep(0.3)
    [(said, _)] = lines.lines
    assert said.startswith("no record in 0.05 s: on the embedded broker (memory://)")
    assert "flowkit send" in said


async def test_a_worker_that_received_records_gives_no_hint() -> None:
    app = build("busydemo")
    driver = TestDriver(app, idle_hint=0.2)
    driver.worker.console.log = lines = Lines()  # type: ignore[assignment]
    async with driver:
        await driver.send(app.topics["clicks"], Click("u1"), key="u1")
        await driver.run_until_idle()
        await asyncio.sleep(0.4)
    assert lines.lines == []
