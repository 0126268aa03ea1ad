"""The App: a declaration of topics, agents, timers and tasks. It does no I/O.

>>> import flowkit
>>> app = flowkit.App("shop")
>>> orders = app.topic("orders", value_type=int)
>>> @app.agent(orders)
... async def count(stream):
...     async for amount in stream:
...         pass
>>> [a.name for a in app.agents]
['count']

A worker runs it (``flowkit worker module:app``); the broker URL is a setting the worker
resolves. Once a worker starts, the declaration is frozen for good, and nothing changes it:
the state of a run (table contents, senders, clocks) lives in the worker, so any number of
workers can run one App, one after another or at the same time.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import tzinfo
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from . import arguments
from .agents import Agent, Output, SinkTarget, Timer
from .appmetrics import AppMetrics
from .codecs import Codec, CodecFormat
from .cron import Cron
from .durations import Seconds, seconds
from .errors import DefinitionError
from .graph import Graph
from .policies import APP_DEFAULT, Action, ErrorPolicy, FailureGuard
from .redaction import redact_url
from .sinks import Sink, runner_options
from .state import GlobalTable, StreamJoin, Table, TableBase
from .state.local import StoreKind, check_store
from .streams.hops import agent_hops
from .streamtime import DEFAULT_MAX_FUTURE
from .topics import Repartition, Topic

__all__ = ["App"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_GUARD = FailureGuard()  # stop after 1,000 failures in a row (frozen: shared)

ProcessingGuarantee = Literal["at_least_once", "exactly_once"]
"""``at_least_once`` (the default): an offset is committed once everything its records
caused is acknowledged. ``exactly_once``: a checkpoint's outputs, changelog writes, dead
letters and offsets are committed in one Kafka transaction."""


def check_guarantee(value: str) -> ProcessingGuarantee:
    """``value`` if it is a processing guarantee, else ``DefinitionError``.

    >>> check_guarantee("exactly_once")
    'exactly_once'
    >>> check_guarantee("exactly-once")
    Traceback (most recent call last):
    flowkit.errors.DefinitionError: processing_guarantee 'exactly-once' is not one of ...
    """
    if value == "at_least_once":
        return "at_least_once"
    if value == "exactly_once":
        return "exactly_once"
    raise DefinitionError(
        f"processing_guarantee {value!r} is not one of 'at_least_once', 'exactly_once'"
    )


def check_standby_replicas(value: object, what: str) -> int:
    """``value`` if flowkit keeps that many standby replicas, else ``DefinitionError``.

    >>> check_standby_replicas(1, "App()")
    1
    >>> check_standby_replicas(2, "App()")
    Traceback (most recent call last):
    flowkit.errors.DefinitionError: App(): standby_replicas must be 0 or 1, not int 2 (with 1, ...
    """
    if value in (0, 1) and type(value) is int:
        return value
    raise DefinitionError(
        f"{what}: standby_replicas must be 0 or 1, not {arguments.shown(value)} (with 1, "
        "every worker keeps a copy of every table partition it does not own)"
    )


class App:
    """A stream-processing application: what to run, not how.

    ``broker`` is the default broker URL (``memory://`` or ``kafka://host:port``);
    ``flowkit worker --broker`` and ``FLOWKIT_BROKER`` override it. ``partitions`` is the
    default partition count of its topics and tables, so they are co-partitioned unless
    told otherwise. ``failure_guard`` is every agent's ``FailureGuard`` unless it sets its
    own (by default: the worker stops after 1,000 failures in a row; None: no guard).
    ``processing_guarantee`` is ``"at_least_once"`` (the default) or ``"exactly_once"``
    (Kafka transactions; see the exactly-once page of the docs). ``client_settings`` are
    Kafka client settings that every worker of the app uses, ``flowkit worker`` included
    (over the broker URL's, under a ``Worker``'s own; not used on ``memory://``): the place
    for a token provider function or a password read from the environment.
    ``store`` is where tables keep their state: ``"memory://"`` (the default) or
    ``"rocksdb://"`` (on local disk; the ``rocksdb`` extra), and ``data_dir`` the directory
    of the local state (``flowkit worker --data-dir`` overrides it; see the state-stores
    page of the docs). With a data directory, memory stores write snapshots when they give
    partitions up, and at a checkpoint every ``snapshot_interval`` seconds if given.
    ``standby_replicas=1`` has every worker keep a warm copy of the plain tables'
    partitions it does not own, so a partition that moves to it replays only the gap
    (``0``, the default: none; see the state-stores page of the docs).
    """

    def __init__(
        self,
        name: str,
        *,
        broker: str = "memory://",
        partitions: int = 1,
        commit_interval: Seconds = 1.0,
        failure_guard: FailureGuard | None = DEFAULT_GUARD,
        processing_guarantee: ProcessingGuarantee = "at_least_once",
        client_settings: Mapping[str, Any] | None = None,
        store: str = "memory://",
        data_dir: str | os.PathLike[str] | None = None,
        snapshot_interval: Seconds | None = None,
        standby_replicas: int = 0,
    ) -> None:
        arguments.name(name, "app name")
        if client_settings is not None and not isinstance(client_settings, Mapping):
            raise DefinitionError(
                f"App(): client_settings must be a dict of Kafka client settings,"
                f" not {type(client_settings).__name__}"
            )
        arguments.text(broker, "App(): broker")
        commit_interval = seconds(commit_interval, "commit_interval")
        if commit_interval <= 0:
            raise DefinitionError("commit_interval must be > 0 seconds")
        if not math.isfinite(commit_interval):
            raise DefinitionError("commit_interval must be a finite number of seconds")
        arguments.count(partitions, "App(): partitions")
        self.name = name
        self.broker = broker
        self.partitions = partitions
        self.commit_interval = commit_interval
        self.failure_guard = FailureGuard.of(failure_guard, f"App {name!r}")
        self.processing_guarantee = check_guarantee(processing_guarantee)
        self.client_settings: dict[str, Any] = dict(client_settings or {})
        self.store: StoreKind = check_store(store, "App()")
        self.data_dir: Path | None = None if data_dir is None else Path(data_dir)
        self.snapshot_interval: float | None = None
        if snapshot_interval is not None:
            self.snapshot_interval = seconds(snapshot_interval, "snapshot_interval")
            if not 0 < self.snapshot_interval < math.inf:
                raise DefinitionError("snapshot_interval must be a finite number of seconds > 0")
        self.standby_replicas = check_standby_replicas(standby_replicas, "App()")
        self.topics: dict[str, Topic[Any]] = {}
        self.agents: list[Agent[Any]] = []
        self.timers: list[Timer] = []
        self.startup_hooks: list[Callable[[], Any]] = []
        self.shutdown_hooks: list[Callable[[], Any]] = []
        self._tables: dict[str, TableBase[Any, Any]] = {}
        self._topic_decls: list[Topic[Any]] = []
        self._frozen = False
        self.metrics = AppMetrics(self._check_open)
        """The app's own Prometheus metrics (see ``flowkit.appmetrics``)."""

    def __repr__(self) -> str:
        return f"<App {self.name!r} broker={redact_url(self.broker)!r}>"

    def client_settings_for(self, url: str) -> dict[str, Any]:
        """The client settings for a broker at ``url``: the app's own on Kafka, none on
        ``memory://`` (the same app runs there too).

        >>> app = App("demo", client_settings={"client_id": "demo-1"})
        >>> app.client_settings_for("kafka://h:9092"), app.client_settings_for("memory://")
        ({'client_id': 'demo-1'}, {})
        """
        return dict(self.client_settings) if url.lower().startswith("kafka://") else {}

    @property
    def tables(self) -> dict[str, TableBase[Any, Any]]:
        """The declared tables by name (a windowed table in the place of its base)."""
        return {
            name: (t.windowed_as or t) if isinstance(t, Table) else t
            for name, t in self._tables.items()
        }

    # -- declarations ---------------------------------------------------------------------

    def topic(
        self,
        name: str,
        value_type: type[T] | Any = Any,
        *,
        key_type: Any = str,
        partitions: int | None = None,
        codec: str | Codec[Any] | CodecFormat | None = None,
        key_codec: str | Codec[Any] | CodecFormat | None = None,
        compacted: bool = False,
        external: bool = False,
    ) -> Topic[T]:
        """Declare a topic; values are decoded into ``value_type`` (JSON by default).

        ``external=True`` says that another service writes the topic (the app only reads
        it) or reads it (the app only writes it): ``flowkit graph --check`` then does not
        warn that nothing in the app writes or reads it.
        """
        self._check_open()
        arguments.name(name, "topic name")
        partitions = self.partitions if partitions is None else partitions
        arguments.count(partitions, f"topic {name!r}: partitions")
        arguments.flag(compacted, f"topic {name!r}: compacted")
        arguments.flag(external, f"topic {name!r}: external")
        topic: Topic[T] = Topic(
            name,
            value_type=value_type,
            key_type=key_type,
            partitions=partitions,
            codec=codec,
            key_codec=key_codec,
            compacted=compacted,
            external=external,
        )
        topic.app_name = self.name
        self._topic_decls.append(topic)
        self.topics.setdefault(name, topic)
        return topic

    def _declare_internal(self, topic: Topic[Any]) -> None:
        if topic.name not in self.topics:
            self._topic_decls.append(topic)
            self.topics[topic.name] = topic

    def table(
        self,
        name: str,
        *,
        default: Callable[[], Any] | None = None,
        key_type: Any = str,
        value_type: Any = Any,
        partitions: int | None = None,
        store: str | None = None,
        ttl: Seconds | None = None,
        ttl_clock: str = "event",
    ) -> Table[Any, Any]:
        """Declare a partitioned table backed by ``<app>-<name>-changelog``.

        ``store`` (``"memory://"`` or ``"rocksdb://"``) overrides the app's ``store``.
        ``ttl`` (seconds or a ``timedelta``) expires a key that long after its last write
        (reads do not count), measured on the table's stream time (the timestamps of the
        records its agents read), or on the worker's wall clock with ``ttl_clock="wall"``;
        an expired key is deleted at the next checkpoint and a tombstone written to the
        changelog. Call ``.tumbling(...)`` or ``.hopping(...)`` on the result for a
        windowed table.
        """
        self._check_open()
        self._check_table_name(name)
        table: Table[Any, Any] = Table(
            name,
            app_name=self.name,
            partitions=self.partitions if partitions is None else partitions,
            default=default,
            key_type=key_type,
            value_type=value_type,
            check_open=self._check_open,
            store=store,
            ttl=ttl,
            ttl_clock=ttl_clock,
        )
        self._tables[name] = table
        return table

    def join(
        self,
        left: Topic[Any],
        right: Topic[Any],
        *,
        name: str,
        within: Seconds | None = None,
        before: Seconds | None = None,
        after: Seconds | None = None,
        grace: Seconds = 0.0,
        how: str = "inner",
        max_future: Seconds = DEFAULT_MAX_FUTURE,
        store: str | None = None,
    ) -> StreamJoin:
        """Declare a windowed join of two topics by record key, as Kafka Streams'
        ``JoinWindows``: a record of ``right`` at ``t'`` matches one of ``left`` at ``t``
        when ``t - before <= t' <= t + after`` (both ``within`` by default). ``how`` is
        ``"inner"``, ``"left"`` or ``"outer"``; ``grace`` (seconds) is how long after its
        window a record may still arrive; ``max_future`` (seconds, 1 hour by default, as
        for windows) how far ahead of the wall clock a timestamp may be before the record
        is dead-lettered as ``FutureRecord``; each duration takes seconds or a
        ``timedelta``. Read it with ``@app.agent(join)``: the agent gets
        ``flowkit.Joined(key, left, right, timestamp)`` values (see
        ``flowkit.state.joins``). Its buffers are backed by ``<app>-<name>-changelog``;
        ``store`` (``"memory://"`` or ``"rocksdb://"``) overrides the app's ``store`` for
        them.
        """
        self._check_open()
        self._check_table_name(name, "join")
        for t in (left, right):
            if not isinstance(t, Topic) or t.name not in self.topics:
                raise DefinitionError(f"join {name!r}: {t!r} is not a topic of this app")
        join = StreamJoin(
            left,
            right,
            name=name,
            app_name=self.name,
            within=within,
            before=before,
            after=after,
            grace=grace,
            how=how,
            max_future=max_future,
            store=store,
        )
        self._tables[name] = join
        return join

    def global_table(
        self,
        name: str,
        *,
        key_type: Any = str,
        value_type: Any = Any,
        partitions: int = 1,
        default: Callable[[], Any] | None = None,
        loader: Callable[[], Iterable[tuple[Any, Any]]] | None = None,
    ) -> GlobalTable[Any, Any]:
        """Declare a table every worker holds whole, fed from the compacted topic ``name``.

        ``loader`` returns ``(key, value)`` pairs the worker produces at start when the
        topic is empty, for reference data generated or read from a file.
        """
        self._check_open()
        self._check_table_name(name)
        if loader is not None:
            arguments.function(loader, f"table {name!r}: loader")
        topic = self.topic(
            name, value_type, key_type=key_type, partitions=partitions, compacted=True
        )
        table: GlobalTable[Any, Any] = GlobalTable(
            name,
            topic=topic,
            loader=loader,
            app_name=self.name,
            partitions=partitions,
            default=default,
            key_type=key_type,
            value_type=value_type,
        )
        self._tables[name] = table
        return table

    def _check_table_name(self, name: str, what: str = "table") -> None:
        arguments.name(name, f"{what} name")
        if name in self._tables:
            raise DefinitionError(f"two tables are named {name!r}")

    def agent(
        self,
        topic: Topic[T] | str | Sequence[Topic[Any] | str] | StreamJoin,
        *,
        name: str | None = None,
        sink: Sequence[SinkTarget] | SinkTarget = (),
        concurrency: int = 1,
        per_record: bool = False,
        on_error: ErrorPolicy
        | Mapping[type[BaseException] | tuple[type[BaseException], ...], Action]
        | None = None,
        dead_letter: str | None = None,
        failure_guard: FailureGuard | None = APP_DEFAULT,
    ) -> Callable[[Callable[..., Any]], Agent[T]]:
        """Declare an agent over ``topic``, or over each topic of a list (``[a, b]``: one
        stream of both, in arrival order per partition); see ``flowkit.agents`` for the
        two forms.

        ``sink`` lists where outputs go: topics, topic names, agents, ``Sink`` objects or
        callables. ``concurrency`` runs that many instances, each owning some partitions,
        so the records of one partition are never reordered. ``on_error`` maps exception
        types to actions (``flowkit.policies``); failed records go to ``dead_letter``
        (default: the app's ``<app>-dlq`` topic). ``failure_guard`` stops the worker when
        the agent fails on too many records (default: the app's; None: no guard).
        """
        self._check_open()
        _check_sources(topic)
        if name is not None:
            arguments.text(name, "@app.agent(): name")
        sinks = _as_list(sink)
        join = topic if isinstance(topic, StreamJoin) else None
        topics: Topic[Any] | str | Sequence[Topic[Any] | str] = (
            [join.left, join.right] if join is not None else topic  # type: ignore[assignment]
        )
        for source in topics if isinstance(topics, list | tuple) else (topics,):
            if isinstance(source, Repartition):
                self._declare_repartition(source)

        def decorate(fn: Callable[..., Any]) -> Agent[T]:
            if not callable(fn):
                raise DefinitionError(
                    f"@app.agent() decorates a function, not {arguments.shown(fn)}"
                )
            agent_name: str = name or getattr(fn, "__name__", None) or "agent"
            if any(a.name == agent_name for a in self.agents):
                raise DefinitionError(f"two agents are named {agent_name!r}")
            for target in sinks:
                _check_sink(agent_name, target)
            agent: Agent[T] = Agent(
                fn,
                name=agent_name,
                topic=topics,
                sinks=sinks,
                concurrency=concurrency,
                per_record=per_record,
                on_error=on_error,
                dead_letter=dead_letter,
                failure_guard=failure_guard,
            )
            agent.join = join
            self._declare_hops(agent)
            self.agents.append(agent)
            return agent

        return decorate

    def _declare_hops(self, agent: Agent[Any]) -> None:
        """Find each ``stream.group_by`` and ``through`` in the agent's body: the agent
        reads their topics besides its own (repartition topics are declared here)."""
        hops = agent_hops(agent.name, agent.fn, agent.topics, self.topics)
        if hops and agent.join is not None:
            raise DefinitionError(
                f"agent {agent.name!r}: group_by and through do not work on a join's stream"
            )
        for topic in hops.values():
            if isinstance(topic, Repartition):
                self._declare_internal(topic)
        agent.hops = hops
        agent.topics = (*agent.topics, *hops.values())

    def _declare_repartition(self, topic: Repartition[Any]) -> None:
        """Declare the internal topic and the re-keying agent behind ``group_by``."""
        if topic.name in self.topics:
            return
        self._declare_internal(topic)
        key_fn = topic.key_fn

        def rekey(value: Any) -> Output:
            return Output(value, key=key_fn(value))

        self.agents.append(
            Agent(
                rekey,
                name=f"{topic.group_name}-repartition",
                topic=topic.source,
                sinks=[topic],
                per_record=True,
                internal=True,
            )
        )

    def timer(
        self,
        interval: Seconds,
        *,
        name: str | None = None,
        on_error: str = "stop",
        on_leader: bool = False,
    ) -> Callable[[F], F]:
        """Call the decorated ``async def`` every ``interval`` seconds (a number or a
        ``datetime.timedelta``) while the worker runs.

        ``on_error``: ``"stop"`` (default: the worker stops, exit 1), ``"restart"`` (log,
        fire again at the next tick) or ``"ignore"`` (log and go on). ``on_leader=True``:
        only the group's leader calls it (see ``crontab``).
        """
        self._check_open()

        def decorate(fn: F) -> F:
            timer = Timer(
                fn,
                name=_fn_name(fn) if name is None else name,
                interval=interval,
                on_error=on_error,
                on_leader=on_leader,
            )
            self.timers.append(timer)
            return fn

        return decorate

    def crontab(
        self,
        cron_format: str,
        *,
        timezone: tzinfo | str | None = None,
        name: str | None = None,
        on_error: str = "stop",
        on_leader: bool = False,
    ) -> Callable[[F], F]:
        """Call the decorated ``async def`` on a cron schedule: ``"0 * * * *"`` is every
        hour on the hour, in ``timezone`` (a ``tzinfo`` or a name like ``"Europe/Paris"``;
        UTC by default), on the worker's clock.

        Every worker calls it, unless ``on_leader=True``: then only the worker that holds
        partition 0 of the app's first input topic (by name) does, so one worker of the
        group runs it. ``on_error`` as for ``timer``.
        """
        self._check_open()
        cron = Cron(cron_format, timezone)

        def decorate(fn: F) -> F:
            timer = Timer(
                fn,
                name=_fn_name(fn) if name is None else name,
                interval=None,
                on_error=on_error,
                cron=cron,
                on_leader=on_leader,
            )
            self.timers.append(timer)
            return fn

        return decorate

    @overload
    def task(self, fn: F, /) -> F: ...
    @overload
    def task(self, fn: None = None, /, *, on_error: str = "stop") -> Callable[[F], F]: ...

    def task(self, fn: F | None = None, /, *, on_error: str = "stop") -> Any:
        """Run the decorated ``async def`` once when the worker starts.

        ``@app.task`` or ``@app.task(on_error=...)``: ``"stop"`` (default: an exception
        stops the worker, exit 1), ``"restart"`` (log, run it again after a backoff) or
        ``"ignore"`` (log and go on without it).
        """
        self._check_open()

        def decorate(f: F) -> F:
            self.timers.append(Timer(f, name=_fn_name(f), interval=None, on_error=on_error))
            return f

        return decorate if fn is None else decorate(fn)

    def on_startup(self, fn: F) -> F:
        """Run the decorated ``async def`` when a worker starts, before any record.

        Startup hooks run one after another, in declaration order, after the worker has
        connected its producer (``topic.send()`` works) and before its agents, timers and
        tasks start. One that raises stops the start (``TaskFailed``).
        """
        self._check_open()
        self.startup_hooks.append(_hook(fn, "on_startup"))
        return fn

    def on_shutdown(self, fn: F) -> F:
        """Run the decorated ``async def`` when a worker stops (``stop()``, SIGINT, SIGTERM).

        Shutdown hooks run one after another, in declaration order, once the agents have
        finished their queued records and before the final commit, so what they send is
        acknowledged before it. One that raises is logged and the next one runs.
        """
        self._check_open()
        self.shutdown_hooks.append(_hook(fn, "on_shutdown"))
        return fn

    # -- the graph ------------------------------------------------------------------------

    def graph(self) -> Graph:
        """The dataflow graph of this declaration."""
        return Graph.build(
            self.name,
            self._topic_decls,
            self.agents,
            self.timers,
            list(self.tables.values()),
            hooks=[*self.startup_hooks, *self.shutdown_hooks],
        )

    # -- freezing -------------------------------------------------------------------------

    def freeze(self) -> None:
        """End the declaration: from now on, declaring raises ``RuntimeError``. A worker
        calls it when it starts; it never undoes it."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        """True once a worker has started (or ``freeze()`` was called)."""
        return self._frozen

    def _check_open(self) -> None:
        if self._frozen:
            raise RuntimeError(
                f"app {self.name!r} is frozen (a worker started): declare everything before"
            )


def _fn_name(fn: object) -> str:
    # A timer's or task's default name; what is not a function says what it is instead,
    # and the Timer refuses it by that name.
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else repr(fn)


def _hook(fn: F, what: str) -> F:
    if not inspect.iscoroutinefunction(fn):
        raise DefinitionError(f"@app.{what} {getattr(fn, '__name__', fn)!r} must be async def")
    return fn


def _check_sources(topic: object) -> None:
    # What @app.agent reads: a topic, a name, a list of them, or a join.
    listed = topic if isinstance(topic, list | tuple) else (topic,)
    for source in listed:
        if not isinstance(source, Topic | str) and not (
            source is topic and isinstance(source, StreamJoin)
        ):
            raise DefinitionError(
                "@app.agent(): topic must be a topic declared with app.topic(), a topic "
                f"name, a list of them, or a join (app.join), not {arguments.shown(source)}"
            )


def _check_sink(agent: str, sink: object) -> None:
    # A sink of an agent: checked here, so `flowkit graph --check` and a worker's start
    # refuse it, rather than the worker failing at its first output.
    if isinstance(sink, str):
        arguments.name(sink, f"agent {agent!r}: sink topic name")
    elif isinstance(sink, type):  # a Sink class has the methods too, unbound
        raise DefinitionError(
            f"agent {agent!r}: sink {sink.__qualname__} is a class: give an instance of it"
        )
    elif isinstance(sink, Sink) or (
        callable(sink) and not isinstance(sink, Topic | Agent | StreamJoin)
    ):
        runner_options(sink)
    elif not isinstance(sink, Topic | Agent):
        raise DefinitionError(
            f"agent {agent!r}: sink must be a topic, a topic name, an agent, a Sink or a "
            f"function, not {arguments.shown(sink)}"
        )


def _as_list(sink: Sequence[SinkTarget] | SinkTarget) -> list[SinkTarget]:
    if isinstance(sink, list | tuple):
        return list(sink)
    return [sink]
