"""The emitter's fan-out loop, compiled: ``Emitter.place`` with the lane's rule written in.

An agent's outputs go out in a loop over the outputs of one record and, for each, over
its destinations. A call to ``Lane.add`` per destination would cost about 3,000
instructions a router order (about 5 % of flowkit's own, measured with ``benchmarks/
router_count.py --instructions``), so the loop is generated, the way ``streams/_loop.py``
generates the stream loop: its source below, with ``lanes.PLACE`` (the one statement of
how a record that fits is placed) written in where an output is placed, compiled once and
registered with ``linecache`` so a traceback shows its lines.

Sizes are counted as ``records.record_size`` counts them, in parts: a value's bytes (and
its headers') once for a fan-out, a key's once per record. ``reference_place`` in
``tests/runtime/test_fanout.py`` is the same loop written plainly, one ``Lane.add`` per
output; a property test holds the two equal.
"""

from __future__ import annotations

from typing import Any

from ...agents import KEEP_KEY, Output
from ...records import Message, headers_size
from ...topics import accepts
from .lanes import Origin, RawOrigin, compiled, place_source

__all__ = ["CHUNK", "SOURCE", "place_outputs"]

# Outputs of one record placed before the publisher is told (and may ask to be relieved):
# a generator of a million outputs still meets the publisher's bound.
CHUNK = 1024

SOURCE = f"""\
def place(self, outs, cause):
    if cause.__class__ is Message:  # a list batch's (memory, aiokafka)
        kept = cause.key  # the record's key, for KEEP_KEY
        origin = Origin(cause, self.agent.name)
    elif cause is None:
        origin = kept = None
    else:
        # A client's own record (librdkafka's, in a RawMessages batch) is not made a
        # Message here: its key is read through the client, and its origin carries the
        # conversion, made only if a send is refused or a sink holds it (``settled``).
        messages = self.source.batch.messages
        kept = messages.key_of(cause)
        origin = RawOrigin(cause, self.agent.name, messages.convert)
    publisher = self._publisher
    limit = publisher.limit
    kept_room = limit if kept is None else limit - len(kept)  # bytes left for the rest
    base, routed = self._dests, self._routed
    placed = n = size = 0
    relieve = False
    runners = None
    value = None
    data = None
    try:
        for out in outs:
            n += 1
            dests = base
            key = KEEP_KEY
            headers = ()
            value = out
            if out.__class__ is Output or isinstance(out, Output):
                value, key, headers = out.value, out.key, out.headers
                if headers.__class__ is not tuple:
                    headers = tuple(headers)
                to = out.to
                if to is not None:
                    try:
                        dests = routed[to]
                    except (KeyError, TypeError):  # not seen yet, or not hashable
                        dests = self._route(to)
            encode = None
            for lane, checked, enc, topic, runner in dests:
                if lane is None:
                    if runners is None:
                        runners = []
                    runners.append(runner)
                    continue
                # a type check that costs one compare when it passes
                if (
                    checked is not None
                    and value.__class__ is not checked
                    and value is not None
                    and not accepts(checked, value.__class__)
                ):
                    raise self._refused(value, topic)
                if enc is not encode:  # a fan-out encodes and sizes a value once
                    encode = enc
                    data = None if value is None else enc(value)
                    size = 0 if data is None else len(data)
                    if headers:
                        size += headers_size(headers)
                if key is KEEP_KEY:
                    raw_key, room = kept, kept_room
                else:
                    raw_key = topic.encode_key(key)
                    room = limit if raw_key is None else limit - len(raw_key)
                parts = lane.parts
                if parts is not None and size <= room:  # Lane.add, written in:
{place_source(20, lane="lane", key="raw_key", value="data", timestamp="None")}
                    placed += 1
                    continue
                # Not placed: a topic whose partition count is not known yet, or a
                # record the publisher refuses (with its message).
                if placed and publisher.placed(placed):
                    relieve = True
                placed = 0
                if publisher.publish(lane.topic, data, raw_key, headers, origin):
                    relieve = True
            if runners is not None or relieve or placed >= CHUNK:
                break  # to wait before the next output (or for a full publisher)
    finally:  # also when the agent raises after some outputs: those are placed
        self.count += n
        if placed and publisher.placed(placed):
            relieve = True
    if runners is None and not relieve and placed < CHUNK:
        return None
    return Wait(runners, value, origin, relieve)
"""


def place_outputs(wait: type) -> Any:
    """``Emitter.place``, compiled (``wait``: the class of what it stops for)."""
    namespace: dict[str, Any] = {
        "CHUNK": CHUNK,
        "KEEP_KEY": KEEP_KEY,
        "Message": Message,
        "Origin": Origin,
        "Output": Output,
        "RawOrigin": RawOrigin,
        "Wait": wait,
        "accepts": accepts,
        "headers_size": headers_size,
    }
    return compiled("emitter place", SOURCE, namespace)
