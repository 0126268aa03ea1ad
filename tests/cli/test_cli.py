"""The ``flowkit`` command: graph rendering, app loading, errors, and a real worker process.

Commands that never start a worker run in-process with typer's CliRunner; the worker runs
as a subprocess (``python -m flowkit.cli worker ...``) and is stopped with real signals.
The apps it loads live in ``apps/``, which is put on ``sys.path`` (or ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flowkit
from flowkit.cli import cli
from flowkit.cli.loader import load_app
from flowkit.errors import AppNotFound, ConfigurationError
from flowkit.graph import Edge, Graph, Node
from flowkit.rendering import FORMATS, render, render_dot, render_mermaid, render_text
from tests.tracebacks import crashes

REPO = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
CLICKSTREAM = "examples.clickstream:app"
SUMMARY = re.compile(r"^processed (\d+) records? in [\d.]+ s \(.* records?/s\)$")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _apps_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # syspath_prepend also restores sys.path afterwards, undoing load_app's insertion.
    monkeypatch.syspath_prepend(str(APPS))
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("FLOWKIT_BROKER", raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(cli, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


# -- flowkit --version / no command -------------------------------------------------------


def test_version() -> None:
    code, out, err = invoke("--version")
    assert (code, out, err) == (0, f"flowkit {flowkit.__version__}\n", "")


def test_no_command_prints_help() -> None:
    code, out, _ = invoke()
    assert code == 0
    assert "worker" in out and "graph" in out


# -- flowkit graph ------------------------------------------------------------------------


def test_graph_text_is_the_default() -> None:
    code, out, err = invoke("graph", CLICKSTREAM)
    assert (code, err) == (0, "")
    assert out == invoke("graph", CLICKSTREAM, "--format", "text")[1]
    assert out.splitlines() == [
        "app clickstream",
        "├── topics",
        "│   ├── clicks (4 partitions, key str, value Click)",
        "│   ├── page-counts (4 partitions, key str, value PageCount)",
        "│   └── clickstream-dlq (1 partition, key bytes, value dead letters, codec raw, "
        "dead_letter, internal)",
        "├── agents",
        "│   ├── count_views",
        "│   │   ├── reads clicks",
        "│   │   ├── writes page-counts",
        "│   │   └── dead_letters clickstream-dlq",
        "│   └── report",
        "│       ├── reads page-counts",
        "│       └── dead_letters clickstream-dlq",
        "└── tasks",
        "    └── generate_traffic",
    ]


def test_graph_json() -> None:
    code, out, _ = invoke("graph", CLICKSTREAM, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["version"] == 1
    assert data["app"] == "clickstream"
    nodes = {n["id"]: n for n in data["nodes"]}
    assert set(nodes) == {
        "topic:clicks",
        "topic:page-counts",
        "topic:clickstream-dlq",
        "agent:count_views",
        "agent:report",
        "task:generate_traffic",
    }
    assert nodes["topic:clicks"]["partitions"] == 4
    assert nodes["topic:clicks"]["value_type"] == "Click"
    assert nodes["topic:page-counts"]["value_type"] == "PageCount"
    assert [(e["source"], e["target"], e["kind"]) for e in data["edges"]] == [
        ("topic:clicks", "agent:count_views", "reads"),
        ("agent:count_views", "topic:page-counts", "writes"),
        ("topic:page-counts", "agent:report", "reads"),
        ("agent:count_views", "topic:clickstream-dlq", "dead_letters"),
        ("agent:report", "topic:clickstream-dlq", "dead_letters"),
    ]
    # Stable: the same declaration always prints the same bytes, keys sorted.
    assert out == invoke("graph", CLICKSTREAM, "-f", "json")[1]
    assert list(data) == sorted(data)


def test_graph_mermaid() -> None:
    code, out, _ = invoke("graph", CLICKSTREAM, "--format", "mermaid")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "flowchart LR"
    ids = {m[1]: m[0] for m in re.findall(r'^ +(n\d+)[\[({]+"([\w-]+)', out, re.MULTILINE)}
    assert set(ids) == {
        "clicks",
        "page-counts",
        "clickstream-dlq",
        "count_views",
        "report",
        "generate_traffic",
    }
    assert f'{ids["clicks"]}[("clicks<br/>' in out  # a topic is a cylinder
    assert f'{ids["report"]}["report"]' in out  # an agent is a box
    assert f'{ids["clicks"]} -->|"reads"| {ids["count_views"]}' in out
    assert f'{ids["count_views"]} -->|"writes"| {ids["page-counts"]}' in out
    assert f'{ids["page-counts"]} -->|"reads"| {ids["report"]}' in out


def test_graph_dot() -> None:
    code, out, _ = invoke("graph", CLICKSTREAM, "--format", "dot")
    assert code == 0
    assert out.startswith('digraph "clickstream" {\n')
    assert out.rstrip().endswith("}")
    assert '"topic:page-counts" [label="page-counts\\n4 partitions' in out
    assert 'shape="cylinder"' in out
    assert '"agent:count_views" -> "topic:page-counts" [label="writes"];' in out
    assert '"topic:clicks" -> "agent:count_views" [label="reads"];' in out


@pytest.mark.parametrize("spec", ["ok_app:app", "ok_app:make_app", "ok_app:nested.app"])
def test_graph_of_an_instance_a_factory_or_a_nested_attribute(spec: str) -> None:
    code, out, err = invoke("graph", spec)
    assert (code, err) == (0, "")
    assert "orders.big-ones (1 partition, key str, value Order)" in out
    assert "heartbeat (every 5 s)" in out


def test_graph_contacts_no_broker() -> None:
    # ``remote`` names a Kafka broker that is not there: any attempt to reach it would end in
    # an error after the connect timeout, not in a graph.
    code, out, _ = invoke("graph", "ok_app:remote", "-f", "json")
    assert code == 0
    assert json.loads(out)["app"] == "remote"


def test_graph_check_ok() -> None:
    code, out, err = invoke("graph", CLICKSTREAM, "--check")
    assert (code, out, err) == (0, "ok: 3 topics, 2 agents, 1 task\n", "")


def test_graph_check_problems() -> None:
    code, out, err = invoke("graph", "problem_app:app", "--check")
    assert code == 1
    assert out == ""
    problems, warnings = err.splitlines()[:3], err.splitlines()[3:]
    assert problems == [
        "agent 'lost' reads topic 'nowhere', which is never declared (app.topic)",
        "agent 'count' writes topic 'counts', which is never declared (app.topic)",
        "agent 'measure' yields int but writes topic 'lengths' whose readers expect str",
    ]
    assert all(line.startswith("warning: topic ") for line in warnings)


def test_graph_check_reports_a_schema_registry_incompatibility_in_one_line() -> None:
    code, out, err = invoke("graph", "registry_app:app", "--check")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "topic 'payments': Payment cannot read version 1 of subject 'payments-value' "
        "(BACKWARD): field 'amount_cents': expected long, found string"
    ]


def test_graph_check_names_an_unreachable_registry_in_one_line() -> None:
    # Nothing listens there; the client's settings in the URL's query, as in production.
    env = {"FLOWKIT_SCHEMA_REGISTRY": "http://ops:hunter2@127.0.0.1:9?max.retries=0"}
    code, out, err = invoke("graph", "examples.schema_registry:app", "--check", env=env)
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith(
        "Error: schema registry http://***@127.0.0.1:9?max.retries=0: subject 'orders-value': "
    )
    assert "hunter2" not in err


TYPO = (
    "warning: topic 'big_orders' is written by agent 'find_big' but nothing in the app reads "
    "it (did you mean 'big-orders'?); if another service reads it, declare it with "
    "app.topic('big_orders', ..., external=True)",
    "warning: topic 'big-orders' is read by agent 'alert' but nothing in the app writes it "
    "(did you mean 'big_orders'?); if another service writes it, declare it with "
    "app.topic('big-orders', ..., external=True)",
)


def test_graph_check_warns_of_a_misspelt_topic_and_passes() -> None:
    code, out, err = invoke("graph", "typo_app:app", "--check")
    assert (code, out) == (0, "ok: 5 topics, 3 agents (2 warnings)\n")
    assert tuple(err.splitlines()) == TYPO


def test_graph_check_strict_fails_on_warnings() -> None:
    code, out, err = invoke("graph", "typo_app:app", "--check", "--strict")
    assert (code, out) == (1, "")
    assert tuple(err.splitlines()) == TYPO


def test_graph_shows_undeclared_topics() -> None:
    code, out, _ = invoke("graph", "problem_app:app")
    assert code == 0
    assert "reads nowhere (undeclared)" in out
    assert "writes counts (undeclared)" in out


# -- bad input: exit 2, one line, no traceback --------------------------------------------

BAD_INPUT = [
    (
        ["graph", "no_such_module_xyz:app"],
        "could not import module 'no_such_module_xyz': No module named 'no_such_module_xyz'",
    ),
    (
        ["graph", "no_such_pkg_xyz.apps:app"],
        "could not import module 'no_such_pkg_xyz.apps': No module named 'no_such_pkg_xyz'",
    ),
    (["graph", "boom_app:app"], "error while importing module 'boom_app': KeyError: 'PORT' (at "),
    (
        ["graph", "missing_dep_app:app"],
        "error while importing module 'missing_dep_app': ModuleNotFoundError: "
        "No module named 'flowkit_no_such_dependency' (at ",
    ),
    (["graph", "ok_app:nope"], "attribute 'nope' not found in module 'ok_app'"),
    (["graph", "ok_app:nested.nope"], "attribute 'nested.nope' not found in module 'ok_app'"),
    (["graph", "ok_app:not_an_app"], "'ok_app:not_an_app' is an int, not a flowkit.App"),
    (["graph", "ok_app:Order"], "'ok_app:Order' is the class Order, not a flowkit.App"),
    (["graph", "ok_app:needs_arguments"], "is a function that needs arguments"),
    (["graph", "ok_app:async_factory"], "is an async function"),
    (["graph", "ok_app:returns_a_string"], "'ok_app:returns_a_string' returned a str, not"),
    (
        ["graph", "ok_app:raises"],
        "error while calling 'ok_app:raises': RuntimeError: no config file (at ",
    ),
    (["graph", "ok_app"], "invalid app 'ok_app': expected \"module:attribute\""),
    (["graph", "ok_app:"], "invalid app 'ok_app:'"),
    (["graph", ":app"], "invalid app ':app'"),
    (["graph", "ok_app:app:x"], "invalid app 'ok_app:app:x'"),
    (["graph", "ok-app:app"], "invalid app 'ok-app:app'"),
    (["worker", "no_such_module_xyz:app"], "could not import module 'no_such_module_xyz'"),
    (["worker", "ok_app:not_an_app"], "is an int, not a flowkit.App"),
    (
        ["worker", "ok_app:app", "--broker", "redis://localhost:6379"],
        "unknown broker scheme 'redis'",
    ),
    (["worker", "ok_app:app", "--broker", "kafka://"], "malformed broker URL 'kafka://'"),
    (["worker", "ok_app:app", "-b", "kafka://localhost"], "'localhost' is not host:port"),
    (["worker", "ok_app:app", "-b", "memory://somewhere"], "memory:// takes no host"),
    (["worker", "ok_app:app", "-b", "localhost:9092"], "malformed broker URL"),
    (["worker", "ok_app:bad_broker"], "unknown broker scheme 'amqp'"),
    (
        ["graph", CLICKSTREAM, "--format", "xml"],
        "Invalid value for '--format' / '-f': "
        "'xml' is not one of 'text', 'mermaid', 'dot', 'json'.",
    ),
    (["worker", CLICKSTREAM, "--log-level", "loud"], "Invalid value for '--log-level'"),
    (["worker", CLICKSTREAM, "--log-format", "xml"], "Invalid value for '--log-format'"),
    (["graph"], "Missing argument 'APP'."),
    (["graph", CLICKSTREAM, "--bogus"], "No such option: --bogus"),
    (["frobnicate"], "No such command 'frobnicate'."),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out, err = invoke(*args)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("Error: ")
    assert message in err
    assert "Traceback" not in err


def test_syntax_error_names_file_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_syntax_app.py").write_text("import flowkit\napp = flowkit.App(\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = invoke("graph", "broken_syntax_app:app")
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("Error: error while importing module 'broken_syntax_app': SyntaxError: ")
    assert "broken_syntax_app.py, line 2" in err


def test_broker_from_the_environment() -> None:
    code, _, err = invoke("worker", "ok_app:app", env={"FLOWKIT_BROKER": "redis://env:1"})
    assert code == 2
    assert "'redis://env:1'" in err


def test_broker_flag_wins_over_the_environment() -> None:
    code, _, err = invoke(
        "worker", "ok_app:app", "--broker", "kafka://", env={"FLOWKIT_BROKER": "redis://env:1"}
    )
    assert code == 2
    assert "'kafka://'" in err and "redis" not in err


# -- load_app -----------------------------------------------------------------------------


def test_load_app_returns_the_instance() -> None:
    import ok_app  # type: ignore[import-not-found]

    assert load_app("ok_app:app") is ok_app.app


def test_load_app_calls_a_factory() -> None:
    first, second = load_app("ok_app:make_app"), load_app("ok_app:make_app")
    assert isinstance(first, flowkit.App) and first is not second


def test_load_app_finds_modules_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here_app.py").write_text("import flowkit\napp = flowkit.App('here')\n")
    monkeypatch.chdir(tmp_path)
    assert load_app("here_app:app").name == "here"


def test_load_app_raises_app_not_found() -> None:
    with pytest.raises(AppNotFound, match="not found in module"):
        load_app("ok_app:missing")


# -- rendering ----------------------------------------------------------------------------


def _odd_graph() -> Graph:
    """Names that need escaping, a kind no renderer knows, and an undeclared edge end."""
    return Graph(
        app="odd.app-1",
        nodes=[
            Node("topic:a.b-c", "topic", "a.b-c", {"partitions": 2, "codec": "msgpack"}),
            Node('sink:say "hi" <now> #1', "sink", 'say "hi" <now> #1', {}),
            Node("table:counts", "table", "counts", {"partitions": 4, "window": "10 s"}),
            Node("agent:fold", "agent", "fold", {"concurrency": 3, "form": "per_record"}),
        ],
        edges=[
            Edge("topic:a.b-c", "agent:fold", "reads"),
            Edge("agent:fold", "table:counts", "updates"),
            Edge("agent:fold", 'sink:say "hi" <now> #1', "writes"),
            Edge("agent:fold", "topic:ghost", "writes"),
        ],
    )


def test_render_text_shows_unknown_kinds_and_attributes() -> None:
    assert render_text(_odd_graph()).splitlines() == [
        "app odd.app-1",
        "├── topics",
        "│   ├── a.b-c (2 partitions, codec msgpack)",
        "│   └── ghost (undeclared)",
        "├── agents",
        "│   └── fold (concurrency 3, per-record)",
        "│       ├── reads a.b-c",
        "│       ├── updates table counts",
        '│       ├── writes sink say "hi" <now> #1',
        "│       └── writes ghost (undeclared)",
        "├── tables",
        "│   └── counts (partitions 4, window 10 s)",
        "└── sinks",
        '    └── say "hi" <now> #1',
    ]


def test_render_mermaid_escapes_labels() -> None:
    out = render_mermaid(_odd_graph())
    assert out.startswith("flowchart LR\n")
    assert '[/"say #quot;hi#quot; #lt;now#gt; #35;1<br/>sink"/]' in out
    assert '("counts<br/>table: partitions 4, window 10 s")' in out  # generic: rounded
    assert '[("ghost<br/>undeclared")]' in out
    for line in out.splitlines()[2:]:
        # Node and edge lines only; every quote is a delimiter, never label text.
        assert line.count('"') in (2, 4), line
    assert len(re.findall(r"-->", out)) == 4


def test_render_dot_escapes_ids_and_labels() -> None:
    out = render_dot(_odd_graph())
    assert out.startswith('digraph "odd.app-1" {')
    assert '"sink:say \\"hi\\" <now> #1" [label="say \\"hi\\" <now> #1\\nsink"' in out
    assert '"table:counts" [label="counts\\ntable: partitions 4, window 10 s", shape="box"' in out
    assert '"topic:ghost" [label="ghost\\nundeclared", shape="cylinder", style="dashed"];' in out
    assert '"agent:fold" -> "table:counts" [label="updates"];' in out


def test_render_json_is_to_dict() -> None:
    graph = _odd_graph()
    assert json.loads(render(graph, "json")) == graph.to_dict()


def test_render_every_format_and_reject_others() -> None:
    graph = load_app(CLICKSTREAM).graph()
    assert all(render(graph, fmt) for fmt in FORMATS)
    with pytest.raises(ConfigurationError, match="unknown graph format 'svg'"):
        render(graph, "svg")


# -- the worker, as a real process ----------------------------------------------------------


class Process:
    """A ``python -m flowkit.cli`` child whose output is read as it comes."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "flowkit.cli", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [
            threading.Thread(target=_drain, args=(self.popen.stdout, self.out), daemon=True),
            threading.Thread(target=_drain, args=(self.popen.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def wait_for(self, ready: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.popen.poll() is not None:
                time.sleep(0.1)  # let the readers catch up before the last look
                if ready():
                    return
                pytest.fail(f"worker exited ({self.popen.returncode}):\n{''.join(self.err)}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker not ready after {timeout} s:\n{''.join(self.err)}")
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def finish(self, timeout: float = 60.0) -> int:
        code = self.popen.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        for reader in self._readers:
            reader.join(timeout=5)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()


def _drain(pipe: Iterator[str], lines: list[str]) -> None:
    for line in pipe:
        lines.append(line)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(*args: str) -> Process:
        process = Process(*args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_worker_stops_gracefully_on_a_signal(
    spawn: Callable[..., Process], signum: signal.Signals
) -> None:
    worker = spawn("worker", CLICKSTREAM)
    worker.wait_for(lambda: len(worker.out) >= 3)  # page counts went round a topic
    worker.signal(signum)
    assert worker.finish() == 0, "".join(worker.err)
    assert all(re.fullmatch(r"\S+ +\d+ views\n", line) for line in worker.out), worker.out
    assert f"signal={signum.name}" in "".join(worker.err)
    assert "worker stopped" in "".join(worker.err)
    summary = SUMMARY.match(worker.err[-1].rstrip("\n"))
    assert summary is not None, worker.err[-1]
    assert int(summary[1]) > 0
    assert not crashes(worker.err)


def test_worker_stops_gracefully_when_its_stdout_closes() -> None:
    # `flowkit worker APP | head -3`: no dead letter per print after head exits, no traceback.
    env = {k: v for k, v in os.environ.items() if k != "FLOWKIT_BROKER"}
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "flowkit.cli", "worker", CLICKSTREAM]
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as popen:
        try:
            assert popen.stdout is not None and popen.stderr is not None
            lines = [popen.stdout.readline() for _ in range(3)]
            popen.stdout.close()  # what head does once it has its lines
            code = popen.wait(timeout=30)
            err = popen.stderr.read()
        finally:
            popen.kill()
    assert all(re.fullmatch(r"\S+ +\d+ views\n", line) for line in lines), lines
    assert code == 0, err
    assert "standard output closed; stopping gracefully" in err
    assert "BrokenPipe" not in err and "record failed" not in err and "Traceback" not in err
    assert SUMMARY.match(err.splitlines()[-1]), err


def test_a_second_signal_forces_the_stop(spawn: Callable[..., Process]) -> None:
    worker = spawn("worker", "slow_app:app")
    worker.wait_for(lambda: "started job 0\n" in worker.out)
    worker.signal(signal.SIGINT)
    worker.wait_for(lambda: any("stopping gracefully" in line for line in worker.err))
    time.sleep(0.3)
    assert worker.popen.poll() is None  # a graceful stop waits for the busy agent
    worker.signal(signal.SIGINT)
    assert worker.finish(timeout=10) == 0, "".join(worker.err)
    assert any("forcing the worker to stop" in line for line in worker.err)
    summary = SUMMARY.match(worker.err[-1].rstrip("\n"))
    assert summary is not None, worker.err[-1]
    assert int(summary[1]) > 0
    assert not crashes(worker.err)


def test_a_fatal_worker_error_is_one_line_and_exit_1(spawn: Callable[..., Process]) -> None:
    worker = spawn("worker", "fatal_app:app", "--log-level", "warning")
    assert worker.finish() == 1
    assert worker.err[-1] == "Error: worker failed: Meltdown: the reactor is on fire\n"
    assert not crashes(worker.err)


def test_an_agent_failing_on_every_record_stops_the_worker_with_one_line(
    spawn: Callable[..., Process],
) -> None:
    worker = spawn("worker", "failing_app:app", "--log-level", "warning")
    assert worker.finish() == 1
    errors = [line for line in worker.err if line.startswith("Error:")]
    assert errors == [
        "Error: worker failed: TooManyFailures: agent 'total' failed on 1,000 records in a "
        "row, the last with ZeroDivisionError: 999 / 0 (numbers/0 offset 999, not committed)\n"
    ]
    assert worker.err[-1] == errors[0]
    assert not crashes(worker.err)


def test_the_worker_warns_of_a_misspelt_topic_when_it_starts(
    spawn: Callable[..., Process],
) -> None:
    worker = spawn("worker", "typo_app:app")
    worker.wait_for(lambda: "worker started" in "".join(worker.err))
    worker.signal(signal.SIGINT)
    assert worker.finish() == 0
    said = "".join(worker.err)
    assert "topic 'big_orders' is written by agent 'find_big'" in said
    assert "(did you mean 'big-orders'?)" in said


FLAKY_AT = "tests/cli/apps/flaky_app.py:16 in share"


def test_a_failed_record_names_the_line_and_the_summary_counts_failures(
    spawn: Callable[..., Process],
) -> None:
    worker = spawn("worker", "flaky_app:app")
    worker.wait_for(lambda: len(worker.out) >= 8)  # the records that did not fail
    worker.signal(signal.SIGINT)
    assert worker.finish() == 0
    said = "".join(worker.err)
    failed = [line for line in worker.err if "record failed" in line]
    assert len(failed) == 4 and all(f"at='{FLAKY_AT}'" in line for line in failed), failed
    # The traceback once, for the first: the rest are the same failure.
    assert said.count("Traceback (most recent call last)") == 1
    assert "line 16, in share" in said
    assert worker.err[-1].startswith("processed ")
    assert worker.err[-1].endswith(
        f"; 4 records failed, most often ZeroDivisionError in agent 'divide' at {FLAKY_AT} (4)\n"
    ), worker.err[-1]


def test_fail_fast_stops_at_the_first_failure_with_its_traceback(
    spawn: Callable[..., Process],
) -> None:
    worker = spawn("worker", "flaky_app:app", "--fail-fast", "--log-level", "warning")
    assert worker.finish() == 1
    said = "".join(worker.err)
    assert "Traceback (most recent call last)" in said and "line 16, in share" in said
    assert worker.err[-1] == "Error: worker failed: ZeroDivisionError: division by zero\n"
    assert worker.out == ["1 100.0\n", "2 50.0\n"]


def test_a_graph_problem_stops_the_worker_before_it_starts(
    spawn: Callable[..., Process],
) -> None:
    worker = spawn("worker", "problem_app:app")
    assert worker.finish() == 2
    assert worker.out == []
    assert worker.err == [
        "Error: agent 'lost' reads topic 'nowhere', which is never declared (app.topic)\n",
        "Error: agent 'count' writes topic 'counts', which is never declared (app.topic)\n",
        "Error: agent 'measure' yields int but writes topic 'lengths' whose readers expect str\n",
    ]


@pytest.mark.parametrize("where", ["option", "environment"])
def test_a_bad_web_token_is_one_line_that_does_not_show_it(where: str) -> None:
    bad = "sec ret-value"
    args = ["worker", "ok_app:app", "--web-port", "0"]
    if where == "option":
        code, out, err = invoke(*args, "--web-token", bad)
    else:
        code, out, err = invoke(*args, env={"FLOWKIT_WEB_TOKEN": bad})
    assert code == 2
    assert err.strip() == "Error: the web token must be printable ASCII without spaces"
    assert "ret-value" not in out + err


def test_the_web_limits_are_checked_before_the_worker_starts() -> None:
    code, _, err = invoke("worker", "ok_app:app", "--web-port", "0", "--web-rate", "0")
    assert code == 2 and "--web-rate" in err and len(err.strip().splitlines()) == 1


def test_standby_replicas_are_checked_before_the_worker_starts() -> None:
    code, _, err = invoke("worker", "ok_app:app", "--standby-replicas", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--standby-replicas: standby_replicas must be 0 or 1, not int 2" in err


def test_a_data_dir_that_is_a_file_is_one_line_before_the_worker_starts(
    tmp_path: Path,
) -> None:
    (tmp_path / "afile").touch()
    code, _, err = invoke("worker", "ok_app:app", "--data-dir", str(tmp_path / "afile" / "d"))
    assert code == 2, err
    last = err.splitlines()[-1]  # (after the graph's warnings about this app's topics)
    assert (
        last
        == f"Error: data directory {tmp_path}/afile/d: {tmp_path}/afile is a file, not a directory"
    )


def test_the_default_data_dir_of_a_disk_store_is_checked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rocksdict")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flowkit-data").write_text("not a directory")
    code, _, err = invoke("worker", "examples.state_on_disk:app")
    assert code == 2, err
    assert err == f"Error: data directory {tmp_path}/flowkit-data is a file, not a directory\n"
