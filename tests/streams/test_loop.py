"""The compiled stream loop agrees with the interpreted reference, for any operator chain.

Hypothesis draws operator chains (filter, map, events, join with each ``missing`` mode;
functions the loop calls and lambdas it writes in as expressions),
records (some that do not decode), batch boundaries and whether a failed record is
retried once; the compiled loop, driven the way the dispatcher drives it (a failure
restarts the agent on the next record, a retry on the same one), must yield the same
values and raise on the same records as the reference applied record by record.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import traceback
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from flowkit.records import Event, Message, RawMessages, TopicPartition
from flowkit.streams import Batch, StreamSource
from flowkit.streams._loop import EVENTS, FILTER, JOIN, MAP, SKIP, interpreted
from flowkit.streams.hops import GROUP_BY, HOP, THROUGH, Hop, split
from flowkit.topics import Topic

TP = TopicPartition("t", 0)


def num(v: Any) -> int:
    """An int from whatever an operator chain made of the value."""
    if isinstance(v, Event):
        return num(v.value)
    if isinstance(v, tuple):
        return num(v[0]) + num(v[1])
    return 0 if v is None else int(v)


class FakeTable:
    """A table-like object: ``get`` and ``name`` are all a join needs."""

    name = "campaigns"

    def __init__(self) -> None:
        self._data = {0: 100, 1: 200, 2: 300}

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)


TABLE = FakeTable()


# Lambdas of the forms the compiled loop writes in as expressions (see _inline.py): on an
# int they read its attributes, on a join's tuple or an event they raise AttributeError.
INLINED_FILTERS = [
    lambda v: v.real > 2,
    lambda v: v.real not in (1, 3, -4),
    lambda v: v.numerator.real,
]
INLINED_MAPS = [lambda v: v.real, lambda v: v.numerator <= 0, lambda v: v.imag is not None]


def make_op(kind: str, k: int) -> tuple[str, Any]:
    if kind == FILTER:
        if k % 2:
            return (FILTER, INLINED_FILTERS[k // 2])
        return (FILTER, lambda v: num(v) % (k + 2) != 0)
    if kind == MAP:
        if k >= 3:
            return (MAP, INLINED_MAPS[k - 3])

        def fn(v: Any) -> int:
            if num(v) % 7 == k:
                raise ValueError(f"map {k} refuses {num(v)}")
            return num(v) + k

        return (MAP, fn)
    if kind == EVENTS:
        return (EVENTS, None)
    missing = ("skip", "none", "error")[k % 3]
    on = operator.attrgetter("real") if k >= 3 else lambda v: num(v) % 5  # "real": inlined
    return (JOIN, (TABLE, on, missing))


ops_strategy = st.lists(
    st.tuples(st.sampled_from([FILTER, MAP, EVENTS, JOIN]), st.integers(0, 5)), max_size=5
).map(lambda chain: tuple(make_op(kind, k) for kind, k in chain))

records_strategy = st.lists(
    st.one_of(st.integers(-50, 50).map(lambda i: str(i).encode()), st.just(b"not json")),
    min_size=1,
    max_size=30,
)


def messages_of(values: list[bytes]) -> list[Message]:
    return [Message("t", 0, i, 1_000 + i, None, v) for i, v in enumerate(values)]


def batch_of(messages: list[Message], raw: bool) -> list[Message] | RawMessages:
    """The records as a list, or as a client's own records (here: (offset, value) pairs)
    made Messages only when asked, as the librdkafka transport returns them."""
    if not raw:
        return messages
    return RawMessages(
        [(m.offset, m.value) for m in messages],
        operator.itemgetter(1),
        lambda r: Message("t", 0, r[0], 1_000 + r[0], None, r[1]),
        lambda r: None,
        lambda r: 1_000 + r[0],
    )


async def run_compiled(
    ops: tuple[tuple[str, Any], ...],
    messages: list[Message],
    cuts: list[int],
    retry: bool,
    raw: bool = False,
) -> tuple[list[tuple[Any, ...]], int]:
    topic: Topic[int] = Topic("t", value_type=int)
    source = StreamSource("agent", maxsize=len(messages) + 1)
    done: list[int] = []
    bounds = sorted({0, len(messages), *(c % len(messages) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        part = batch_of(messages[start:end], raw)
        await source.put(Batch(topic, TP, part, lambda: done.append(1)))
    source.close()
    out: list[tuple[Any, ...]] = []
    retried: set[int] = set()
    while True:
        try:
            async for value in source.iterate(ops):
                out.append(("value", value))
                # What a table reads for the record's time: its decoded value.
                message = source.current_message()
                assert message is not None and source.value == int(message.value)
                assert source.event_time() == message.timestamp
            break
        except Exception as exc:  # what Dispatcher.drive does with a failed record
            message = source.current_message()
            assert message is not None
            out.append(("error", message.offset, type(exc).__name__))
            if retry and message.offset not in retried:
                retried.add(message.offset)
                source.retry_current()
    assert source.ended()
    return out, len(done)


def run_reference(
    ops: tuple[tuple[str, Any], ...], messages: list[Message], retry: bool
) -> list[tuple[Any, ...]]:
    topic: Topic[int] = Topic("t", value_type=int)
    apply = interpreted(ops)
    decode = topic.decoder()
    out: list[tuple[Any, ...]] = []
    for m in messages:
        try:
            try:
                value = decode(m.value)
            except Exception as exc:
                raise topic.decode_error(exc) from None
            result = apply(value, topic, m)
        except Exception as exc:
            out.extend([("error", m.offset, type(exc).__name__)] * (2 if retry else 1))
            continue
        if result is not SKIP:
            out.append(("value", result))
    return out


@settings(max_examples=150, deadline=None)
@given(
    ops=ops_strategy,
    values=records_strategy,
    cuts=st.lists(st.integers(0, 30), max_size=4),
    retry=st.booleans(),
    raw=st.booleans(),
)
def test_the_compiled_loop_matches_the_reference(
    ops: tuple[tuple[str, Any], ...], values: list[bytes], cuts: list[int], retry: bool, raw: bool
) -> None:
    messages = messages_of(values)
    compiled, batches_done = asyncio.run(run_compiled(ops, messages, cuts, retry, raw))
    assert compiled == run_reference(ops, messages, retry)
    assert batches_done == len({0, len(messages), *(c % len(messages) for c in cuts)}) - 1


async def test_a_client_record_gives_its_key_and_time_without_a_message() -> None:
    # What an agent's outputs and a windowed table read of a librdkafka record: its key
    # and timestamp through the client, with no Message made for it.
    made: list[Any] = []

    def convert(r: tuple[Message]) -> Message:
        made.append(r)
        return r[0]

    messages = [Message("t", 0, i, 1_000 + i, b"k%d" % i, b"%d" % i) for i in range(3)]
    run = RawMessages(
        [(m,) for m in messages],
        lambda r: r[0].value,
        convert,
        lambda r: r[0].key,
        lambda r: r[0].timestamp,
    )
    source = StreamSource("agent")
    await source.put(Batch(Topic("t", value_type=int), TP, run, lambda: None))
    source.close()
    seen = []
    async for value in source.iterate(()):
        record = source.current_record()
        assert record is run.raw[value]
        seen.append((value, run.key_of(record), source.event_time()))
    assert seen == [(0, b"k0", 1_000), (1, b"k1", 1_001), (2, b"k2", 1_002)]
    assert made == []


def test_a_traceback_through_the_loop_shows_its_source() -> None:
    def explode(v: Any) -> Any:
        raise RuntimeError("boom")

    async def main() -> str:
        out = await run_compiled(
            ((FILTER, lambda v: True), (MAP, explode)), messages_of([b"1"]), [], False
        )
        assert out[0] == [("error", 0, "RuntimeError")]
        topic: Topic[int] = Topic("t", value_type=int)
        source = StreamSource("agent")
        await source.put(Batch(topic, TP, messages_of([b"1"]), lambda: None))
        try:
            async for _ in source.iterate(((MAP, explode),)):
                pass
        except RuntimeError:
            return traceback.format_exc()
        raise AssertionError("the map did not raise")

    text = asyncio.run(main())
    assert "<flowkit stream loop" in text
    assert "v = f0(v)" in text  # the generated line, not an empty frame


def test_an_inlined_lambda_shows_as_its_expression_in_a_traceback() -> None:
    async def main() -> str:
        topic: Topic[int] = Topic("t", value_type=int)
        source = StreamSource("agent")
        await source.put(Batch(topic, TP, messages_of([b"1"]), lambda: None))
        try:
            async for _ in source.iterate(((FILTER, lambda v: v.kind == "view"),)):
                pass
        except AttributeError:
            return traceback.format_exc()
        raise AssertionError("the filter did not raise")

    text = asyncio.run(main())
    assert "if not (v.kind == c0):" in text  # written in, not called


async def run_per_record(
    messages: list[Message],
    cuts: list[int],
    is_async: bool,
    many: bool,
    compiled: bool,
    raw: bool = False,
) -> tuple[list[Any], int]:
    """A per-record agent over ``messages``, the way the dispatcher drives one: its function
    called from the compiled loop (``call_each``), or from an ``async for`` over the stream."""
    topic: Topic[int] = Topic("t", value_type=int)
    source = StreamSource("agent", maxsize=len(messages) + 1)
    done: list[int] = []
    bounds = sorted({0, len(messages), *(c % len(messages) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        part = batch_of(messages[start:end], raw)
        await source.put(Batch(topic, TP, part, lambda: done.append(1)))
    source.close()
    log: list[Any] = []

    def sync_fn(v: int) -> Any:
        if v % 5 == 0:
            raise ValueError(v)  # dealt with in place
        if v % 7 == 3:
            raise KeyError(v)  # raised out of the loop: the agent starts again
        return None if v % 3 == 0 else v * 2

    def gen_fn(v: int) -> Any:
        yield v
        sync_fn(v)
        yield v + 1

    async def async_fn(v: int) -> Any:
        await asyncio.sleep(0)
        return sync_fn(v)

    fn = async_fn if is_async else gen_fn if many else sync_fn

    def emit(out: Any) -> Any:
        log.append(("out", out))
        return asyncio.sleep(0) if out % 2 else None

    class Emitter:  # the worker's Emitter, as call_each uses it: emit per output
        def place(self, outs: Any, cause: Any) -> Any:
            for out in outs:
                wait = emit(out)
                if wait is not None:  # awaited before the agent's next output
                    return wait
            return None

        async def settle(self, wait: Any) -> None:
            await wait

    async def failed(exc: Exception, record: Any) -> bool:
        assert record is source.current_record()  # the loop's record is the cursor's
        message = source.current_message()
        assert message is not None
        log.append(("failed", message.offset, type(exc).__name__))
        return isinstance(exc, ValueError)

    async def generic() -> None:  # what _drive_per_record does for a stream-stream join
        async for value in source.iterate(()):
            try:
                out = fn(value)
                if is_async:
                    out = await out
                if many:
                    for one in out:
                        pending = emit(one)
                        if pending is not None:
                            await pending
                elif out is not None:
                    pending = emit(out)
                    if pending is not None:
                        await pending
            except Exception as exc:
                if not await failed(exc, source.current_record()):
                    raise

    while True:
        try:
            if compiled:
                await source.call_each(fn, Emitter(), failed, is_async=is_async, many=many)
            else:
                await generic()
            break
        except Exception as exc:
            message = source.current_message()
            log.append(("raised", None if message is None else message.offset, type(exc).__name__))
    assert source.ended()
    return log, len(done)


@settings(max_examples=60, deadline=None)
@given(
    values=records_strategy,
    cuts=st.lists(st.integers(0, 30), max_size=4),
    form=st.sampled_from([(False, False), (True, False), (False, True)]),
    raw=st.booleans(),
)
def test_a_per_record_function_called_from_the_loop_matches_the_async_for(
    values: list[bytes], cuts: list[int], form: tuple[bool, bool], raw: bool
) -> None:
    messages = messages_of(values)
    is_async, many = form
    compiled = asyncio.run(run_per_record(messages, cuts, is_async, many, compiled=True, raw=raw))
    assert compiled == asyncio.run(run_per_record(messages, cuts, is_async, many, compiled=False))


# -- the hop walker (group_by, through) against the same reference ---------------------

HOP_TOPIC = "t-hop"


class Sent:
    """The worker's sender, as a hop uses it: each forward recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    async def send_bytes(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Any = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.sent.append((topic, value, key, timestamp_ms))


def hop_chain(
    kind: str, before: list[tuple[str, int]], after: tuple[tuple[str, Any], ...]
) -> tuple[Hop, tuple[tuple[str, Any], ...]]:
    step = (
        Hop(GROUP_BY, "by", lambda v: num(v) % 3) if kind == GROUP_BY else Hop(THROUGH, HOP_TOPIC)
    )
    allowed = (FILTER,) if kind == GROUP_BY else (FILTER, MAP)
    pre = tuple(make_op(k, n) for k, n in before if k in allowed)
    return step, (*pre, (HOP, step), *after)


def hop_batches(parts: list[tuple[bool, list[bytes]]]) -> list[tuple[str, list[Message]]]:
    """The batches in arrival order, each of the agent's topic or (True) of the hop's."""
    offsets = {"t": 0, HOP_TOPIC: 0}
    out = []
    for home, values in parts:
        name = HOP_TOPIC if home else "t"
        batch = []
        for v in values:
            batch.append(Message(name, 0, offsets[name], 1_000 + offsets[name], b"k", v))
            offsets[name] += 1
        out.append((name, batch))
    return out


async def run_hop(
    step: Hop,
    ops: tuple[tuple[str, Any], ...],
    batches: list[tuple[str, list[Message]]],
    retry: bool,
    in_place: bool,
) -> tuple[list[tuple[Any, ...]], list[Any], int]:
    topics = {
        "t": Topic("t", value_type=int),
        HOP_TOPIC: Topic(HOP_TOPIC, value_type=int, key_type=int),
    }
    sender = Sent()
    source = StreamSource("agent", maxsize=len(batches) + 1, sender=sender)
    source.hops[step.ref] = topics[HOP_TOPIC]
    out: list[tuple[Any, ...]] = []

    async def undecodable(exc: Exception) -> None:  # the worker, dead-lettering in place
        message = source.current_message()
        assert message is not None
        out.append(("dead", message.topic, message.offset))

    if in_place:
        source.undecodable = undecodable
    done: list[int] = []
    for name, messages in batches:
        tp = TopicPartition(name, 0)
        await source.put(Batch(topics[name], tp, messages, lambda: done.append(1)))
    source.close()
    retried: set[tuple[str, int]] = set()
    while True:
        try:
            async for value in source.iterate(ops):
                out.append(("value", value))
            break
        except Exception as exc:  # what Dispatcher.drive does with a failed record
            message = source.current_message()
            assert message is not None
            out.append(("error", message.topic, message.offset, type(exc).__name__))
            if retry and (message.topic, message.offset) not in retried:
                retried.add((message.topic, message.offset))
                source.retry_current()
    assert source.ended()
    return out, sender.sent, len(done)


def hop_reference(
    step: Hop,
    ops: tuple[tuple[str, Any], ...],
    batches: list[tuple[str, list[Message]]],
    retry: bool,
    in_place: bool,
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    _, before, after = split(ops)
    hop_topic: Topic[int] = Topic(HOP_TOPIC, value_type=int, key_type=int)
    topics = {"t": Topic("t", value_type=int), HOP_TOPIC: hop_topic}
    out: list[tuple[Any, ...]] = []
    sent: list[Any] = []
    for name, messages in batches:
        topic = topics[name]
        apply = interpreted(after if name == HOP_TOPIC else before)
        for m in messages:
            try:
                value = topic.decoder()(m.value)
            except Exception:
                if in_place:
                    out.append(("dead", name, m.offset))
                else:
                    out.extend([("error", name, m.offset, "DecodeError")] * (1 + retry))
                continue
            try:
                result = apply(value, topic, m)
            except Exception as exc:
                out.extend([("error", name, m.offset, type(exc).__name__)] * (1 + retry))
                continue
            if result is SKIP:
                continue
            if name == HOP_TOPIC:
                out.append(("value", result))
            elif step.key is None:
                sent.append((HOP_TOPIC, hop_topic.encode(result), m.key, m.timestamp))
            else:
                key = hop_topic.encode_key(step.key(result))
                sent.append((HOP_TOPIC, hop_topic.encode(result), key, m.timestamp))
    return out, sent


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from([GROUP_BY, THROUGH]),
    before=st.lists(st.tuples(st.sampled_from([FILTER, MAP]), st.integers(0, 5)), max_size=3),
    after=ops_strategy,
    parts=st.lists(st.tuples(st.booleans(), records_strategy), min_size=1, max_size=4),
    retry=st.booleans(),
    in_place=st.booleans(),
)
def test_the_hop_walker_matches_the_reference(
    kind: str,
    before: list[tuple[str, int]],
    after: tuple[tuple[str, Any], ...],
    parts: list[tuple[bool, list[bytes]]],
    retry: bool,
    in_place: bool,
) -> None:
    # A hop walks a batch of its agent's topic (each value through the operators before
    # the hop, then forwarded) or of the hop topic (each value through the operators after
    # it, to the agent); a record that does not decode is dead-lettered in place, as the
    # compiled loop does, or raised through the agent, which starts again after it.
    step, ops = hop_chain(kind, before, after)
    batches = hop_batches(parts)
    got, sent, done = asyncio.run(run_hop(step, ops, batches, retry, in_place))
    assert (got, sent) == hop_reference(step, ops, batches, retry, in_place)
    assert done == len(batches)


# -- the stream-stream join walker against a reference ---------------------------------

JOIN_T0 = 1_700_000_000_000  # the records' times; the wall clock the join's guard reads
FUTURE = JOIN_T0 + 2 * 3_600_000  # beyond the guard (max_future: an hour)
JOIN_KEYS = {0: [b"a", b"b", None], 1: [b"c", None]}  # per partition (None: no key)


def joined_num(j: Any) -> int:
    """An int from a join's result: the sum of its sides' values and its time."""
    return sum(int(x) for x in (j.left, j.right) if x is not None) + j.timestamp - JOIN_T0


# After the join: a filter and a map that never raise, and a map that does on some results
# (the agent then starts again; the rest of that record's results are lost with it, as the
# dispatcher dead-letters the record).
JOIN_OPS = {
    "keep": (FILTER, lambda j: joined_num(j) % 3 != 0),
    "time": (MAP, lambda j: (j.key, j.left, j.right, j.timestamp - JOIN_T0)),
    "boom": (MAP, lambda j: j if joined_num(j) % 5 else 1 // 0),
}

# One record: its partition, side (0 left, 1 right), key (an index into the partition's
# keys), value (an int, or bytes that are not JSON, or None) and time: late ones come when
# a window has closed; FUTURE is beyond the guard.
join_record = st.tuples(
    st.integers(0, 1),
    st.integers(0, 1),
    st.integers(0, 2),
    st.one_of(st.integers(-9, 9).map(lambda i: str(i).encode()), st.just(b"{"), st.none()),
    st.one_of(st.integers(0, 20).map(lambda t: JOIN_T0 + t), st.just(FUTURE)),
)


def join_batches(
    records: list[tuple[int, int, int, bytes | None, int]], cuts: list[int]
) -> list[tuple[str, int, list[Message]]]:
    """The records in arrival order, cut into batches of one topic-partition each (a
    batch ends where the next record is of another topic-partition, or at a cut)."""
    offsets: dict[tuple[str, int], int] = {}
    out: list[tuple[str, int, list[Message]]] = []
    for n, (p, side, k, value, ts) in enumerate(records):
        name = ("left", "right")[side]
        keys = JOIN_KEYS[p]
        offset = offsets[name, p] = offsets.get((name, p), -1) + 1
        m = Message(name, p, offset, ts, keys[k % len(keys)], value)
        if out and out[-1][:2] == (name, p) and n not in cuts:
            out[-1][2].append(m)
        else:
            out.append((name, p, [m]))
    return out


def stream_join(how: str) -> Any:
    from flowkit.state.joins import StreamJoin

    left: Topic[int] = Topic("left", value_type=int, partitions=2)
    right: Topic[int] = Topic("right", value_type=int, partitions=2)
    return StreamJoin(left, right, name="j", app_name="t", within=0.005, grace=0.003, how=how)


async def run_joined(
    how: str,
    ops: tuple[tuple[str, Any], ...],
    batches: list[tuple[str, int, list[Message]]],
    in_place: bool,
) -> tuple[dict[int, list[tuple[Any, ...]]], int]:
    join = stream_join(how)
    store = join.new_store(lambda: JOIN_T0)
    store.assign([0, 1])
    topics = {"left": join.left, "right": join.right}
    source = StreamSource("agent", maxsize=len(batches) + 1, stores={join: store}, join=join)
    out: dict[int, list[tuple[Any, ...]]] = {0: [], 1: []}

    async def undecodable(exc: Exception) -> None:  # the worker, dead-lettering in place
        message = source.current_message()
        assert message is not None
        out[message.partition].append(("dead", message.topic, message.offset, type(exc).__name__))

    if in_place:
        source.undecodable = undecodable
    done: list[int] = []
    for name, p, messages in batches:
        tp = TopicPartition(name, p)
        await source.put(Batch(topics[name], tp, messages, lambda: done.append(1)))
    source.close()
    while True:
        try:
            async for value in source.iterate(ops):
                message = source.current_message()
                assert message is not None
                out[message.partition].append(("value", value))
            break
        except Exception as exc:  # what Dispatcher.drive does with a failed record
            message = source.current_message()
            assert message is not None
            out[message.partition].append(
                ("error", message.topic, message.offset, type(exc).__name__)
            )
    assert source.ended()
    return out, len(done)


def joined_reference(
    how: str,
    ops: tuple[tuple[str, Any], ...],
    batches: list[tuple[str, int, list[Message]]],
    in_place: bool,
) -> dict[int, list[tuple[Any, ...]]]:
    """Per partition, both topics' records merged by time (the earlier head first, the
    left one on a tie; a head beyond the guard at once), each through the join's store
    and ``ops``: the join's semantics written plainly, one record at a time."""
    join = stream_join(how)
    store = join.new_store(lambda: JOIN_T0)
    store.assign([0, 1])
    apply = interpreted(ops)
    limit = JOIN_T0 + join.max_future_ms
    out: dict[int, list[tuple[Any, ...]]] = {0: [], 1: []}
    for p in (0, 1):
        left = [m for name, q, ms in batches if name == "left" and q == p for m in ms]
        right = [m for name, q, ms in batches if name == "right" and q == p for m in ms]
        part = store.part(p)
        events = out[p]
        while left or right:
            if not right or (left and left[0].timestamp <= right[0].timestamp):
                side, later = 0, right[0].timestamp if right else left[0].timestamp
            else:
                side, later = 1, left[0].timestamp if left else right[0].timestamp
            if later > limit:  # the later head is beyond the guard: it goes first
                side = 1 if right and right[0].timestamp == later else 0
            m = (left, right)[side].pop(0)
            topic = (join.left, join.right)[side]
            try:
                if m.key is not None and m.value is not None:
                    try:
                        v = topic.decoder()(m.value)
                    except Exception as exc:
                        raise topic.decode_error(exc) from None
                if m.timestamp > limit:
                    raise store.future_record(m.timestamp)
                if m.key is None or m.value is None:
                    results = store.tick(part, m.timestamp)
                else:
                    results = store.process(part, side, m.key, m.offset, m.timestamp, m.value, v)
            except Exception as exc:  # bad input: a dead letter, or raised (a restart)
                kind = "dead" if in_place else "error"
                events.append((kind, m.topic, m.offset, type(exc).__name__))
                continue
            for result in results or ():
                try:
                    value = apply(result, topic, m)
                except Exception as exc:
                    events.append(("error", m.topic, m.offset, type(exc).__name__))
                    break
                if value is not SKIP:
                    events.append(("value", value))
            if part.settle:
                store.settle(part)
    return out


@settings(max_examples=40, deadline=None)
@given(
    how=st.sampled_from(["inner", "left", "outer"]),
    ops=st.lists(st.sampled_from(sorted(JOIN_OPS)), max_size=3),
    records=st.lists(join_record, min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    in_place=st.booleans(),
)
# A tie: the left head (bad) goes before the right one (which pairs with the first record).
@example(
    how="inner",
    ops=[],
    records=[(0, 0, 0, b"1", JOIN_T0), (0, 0, 0, b"{", JOIN_T0 + 3), (0, 1, 0, b"2", JOIN_T0 + 3)],
    cuts=[],
    in_place=True,
)
def test_the_join_walker_matches_the_reference(
    how: str,
    ops: list[str],
    records: list[tuple[int, int, int, bytes | None, int]],
    cuts: list[int],
    in_place: bool,
) -> None:
    # The join walks the batches of both topics side by side, record by record in time
    # order per partition; a record that does not decode, is late or is beyond the guard
    # is dead-lettered in place, the walk going on (or, with no worker to take it, raised
    # through the agent, which starts again after it); an operator after the join that
    # raises starts the agent again after the record.
    chain = tuple(JOIN_OPS[name] for name in ops)
    batches = join_batches(records, cuts)
    got, done = asyncio.run(run_joined(how, chain, batches, in_place))
    assert got == joined_reference(how, chain, batches, in_place)
    assert done == len(batches)
