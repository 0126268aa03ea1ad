"""Which worker of the group serves which partition's table reads: signed adverts.

Each worker with a web endpoint writes an *advert* to the compacted topic
``<app>-web-endpoints``: its URL (the record's key) and the partitions it holds, signed
with HMAC-SHA256 under a secret every worker of the group shares (``FLOWKIT_WEB_SECRET``).
Anyone allowed to produce to that topic can write a record there, so a worker believes an
advert only when its signature is right, its URL is a plain ``http(s)://host:port`` and it
is newer than the last one from the same URL (an old advert written again changes
nothing). Everything else (no signature or a wrong one, a record that is not an advert, a
tombstone, a URL with a path, a user or odd characters) is passed over with a log line,
at most one per kind a minute.

One ``EndpointDirectory`` per worker follows the topic with one group-less consumer and
keeps ``partition -> URL`` in memory; a table read asks it, and touches no broker.

>>> secret = b"s3cret"
>>> value = advert_value("http://10.0.0.7:9100", [0, 2], at=1.5)
>>> headers = signed_headers(secret, "shop-web-endpoints", b"http://10.0.0.7:9100", value)
>>> check_advert(secret, "shop-web-endpoints", b"http://10.0.0.7:9100", value, headers)
Advert(url='http://10.0.0.7:9100', partitions=[0, 2], at=1.5)
>>> check_advert(b"guess", "shop-web-endpoints", b"http://10.0.0.7:9100", value, headers)
Traceback (most recent call last):
...
flowkit.runtime.web.endpoints.BadAdvert: bad signature
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Annotated

import msgspec
import structlog

from ...codecs import DECODE_FAILURES
from ...records import Headers, Message, TopicPartition
from ...transports import Consumer, Transport
from ..lifecycle.secrets import inherited_secrets
from ..observe.logbudget import LogBudget

__all__ = [
    "SECRET_VAR",
    "SIGNATURE_HEADER",
    "Advert",
    "BadAdvert",
    "EndpointDirectory",
    "advert_value",
    "check_advert",
    "check_url",
    "secret_from_env",
    "signed_headers",
]

log = structlog.get_logger(__name__)

SECRET_VAR = "FLOWKIT_WEB_SECRET"
"""The environment variable holding the secret the group's workers sign adverts with."""
SIGNATURE_HEADER = "flowkit-signature"
"""The record header carrying an advert's HMAC-SHA256, in hex."""

_POLL_TIMEOUT = 0.5
_MAX_RECORDS = 10_000
# A URL as a worker advertises it: a scheme, a host name or IPv4 address or bracketed IPv6
# address, and a port; nothing else (no user, path, query, fragment, space or CR/LF: the
# URL goes into a Location header and the parent's forwarding).
_URL = re.compile(
    r"(?P<scheme>https?)://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])"
    r":(?P<port>[0-9]{1,5})"
)


class BadAdvert(Exception):
    """A record of the endpoints topic that is not an advert to believe (the reason)."""


class Advert(msgspec.Struct):
    """What a worker advertises: its URL, the partitions it holds, and when (epoch s)."""

    url: str
    partitions: list[Annotated[int, msgspec.Meta(ge=0)]]
    at: float


_decode = msgspec.json.Decoder(Advert).decode


def secret_from_env() -> bytes | None:
    """The group's signing secret: the one a process group's parent passed this process
    (``lifecycle.secrets.inherited_secrets``), else ``FLOWKIT_WEB_SECRET``; None when unset or
    empty."""
    value = inherited_secrets().get(SECRET_VAR) or os.environ.get(SECRET_VAR, "")
    return value.encode() if value else None


def check_url(url: str) -> str:
    """``url`` if it is ``http(s)://host:port`` (port 1-65535), else ``BadAdvert``.

    >>> check_url("https://w1.example:9100")
    'https://w1.example:9100'
    >>> check_url("http://169.254.169.254:80/latest/meta-data")
    Traceback (most recent call last):
    ...
    flowkit.runtime.web.endpoints.BadAdvert: not an http(s)://host:port URL
    """
    match = _URL.fullmatch(url)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise BadAdvert("not an http(s)://host:port URL")
    return url


def advert_value(url: str, partitions: Sequence[int], *, at: float) -> bytes:
    """The record value of an advert."""
    return msgspec.json.encode(Advert(url, list(partitions), at))


def _signature(secret: bytes, topic: str, key: bytes, value: bytes) -> str:
    # The topic is signed too: an advert of another app sharing the secret is not one of ours.
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (topic.encode(), key, value):
        mac.update(len(part).to_bytes(8, "big"))  # lengths first: no two splits collide
        mac.update(part)
    return mac.hexdigest()


def signed_headers(secret: bytes, topic: str, key: bytes, value: bytes) -> Headers:
    """The headers that sign the advert ``key``/``value`` written to ``topic``."""
    return ((SIGNATURE_HEADER, _signature(secret, topic, key, value).encode()),)


def check_advert(
    secret: bytes, topic: str, key: bytes | None, value: bytes | None, headers: Headers
) -> Advert:
    """The advert a record of ``topic`` carries, or ``BadAdvert`` saying why not."""
    if key is None:
        raise BadAdvert("no key")
    if value is None:
        raise BadAdvert("a tombstone")
    signatures = [v for k, v in headers if k == SIGNATURE_HEADER]
    if len(signatures) != 1 or signatures[0] is None:
        raise BadAdvert("not signed")
    expected = _signature(secret, topic, key, value).encode()
    if not hmac.compare_digest(signatures[0], expected):
        raise BadAdvert("bad signature")
    try:
        advert = _decode(value)
    except DECODE_FAILURES:
        raise BadAdvert("not an advert") from None
    if advert.url.encode() != key:
        raise BadAdvert("the URL is not the record's key")
    check_url(advert.url)
    if not math.isfinite(advert.at):
        raise BadAdvert("not an advert")
    return advert


class EndpointDirectory:
    """``partition -> URL`` of the other workers of the group, from their signed adverts.

    ``start`` opens one group-less consumer on the endpoints topic and follows it in a task
    until ``aclose``; ``owner(p)`` answers from memory. ``own_url`` is left out (a worker
    serves its own partitions itself). ``skipped`` counts the records passed over.
    """

    def __init__(self, transport: Transport, topic: str, secret: bytes, own_url: str) -> None:
        self.transport = transport
        self.topic = topic
        self.own_url = own_url
        self._secret = secret
        self._adverts: dict[str, Advert] = {}
        self._owners: dict[int, str] = {}
        self._consumer: Consumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._budget = LogBudget(time.monotonic, burst=1, interval=60.0)
        self._unlogged: dict[str, int] = {}  # reason -> records passed over since its line
        self.read = 0
        self.skipped = 0

    def owner(self, partition: int) -> str | None:
        """The URL of the other worker that holds ``partition``, by its latest advert."""
        return self._owners.get(partition)

    def owners(self) -> dict[int, str]:
        """A copy of the whole table: partition -> URL."""
        return dict(self._owners)

    async def start(self) -> None:
        """Follow the topic (which must exist) from its start."""
        consumer = self.transport.consumer(group_id=None, client_id="flowkit-web-endpoints")
        await consumer.start()
        count = await self.transport.partition_count(self.topic) or 1
        consumer.assign({TopicPartition(self.topic, p) for p in range(count)})
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow(consumer), name="web-endpoints")

    async def aclose(self) -> None:
        """Stop following. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.aclose()

    async def _follow(self, consumer: Consumer) -> None:
        while True:
            try:
                batches = await consumer.getmany(_POLL_TIMEOUT, _MAX_RECORDS)
            except Exception as exc:  # the broker may be away: the client reconnects
                if self._budget.allow("fetch"):
                    log.warning("reading the web endpoints' adverts failed", error=repr(exc))
                await asyncio.sleep(_POLL_TIMEOUT)
                continue
            for messages in batches.values():
                self.apply(messages)

    def apply(self, messages: Sequence[Message]) -> None:
        """Take in records of the topic: believe the good adverts, pass over the rest."""
        changed = False
        for m in messages:
            self.read += 1
            try:
                advert = check_advert(self._secret, self.topic, m.key, m.value, m.headers)
            except BadAdvert as exc:
                self._skip(m, str(exc))
                continue
            known = self._adverts.get(advert.url)
            if known is not None and advert.at <= known.at:
                self._skip(m, "not newer than the last advert of its URL")
                continue
            self._adverts[advert.url] = advert
            changed = True
        if changed:
            self._owners = self._claims()

    def _claims(self) -> dict[int, str]:
        claims: dict[int, tuple[float, str]] = {}
        for url, advert in self._adverts.items():
            if url == self.own_url:
                continue
            for p in advert.partitions:
                if p not in claims or advert.at > claims[p][0]:
                    claims[p] = (advert.at, url)
        return {p: url for p, (_, url) in claims.items()}

    def _skip(self, m: Message, reason: str) -> None:
        self.skipped += 1
        if not self._budget.allow(reason):
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        else:
            log.warning(
                "passed over a record of the web endpoints topic",
                reason=reason,
                topic=m.topic,
                partition=m.partition,
                offset=m.offset,
                more_since_last_line=self._unlogged.pop(reason, 0),
            )
