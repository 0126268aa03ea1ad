"""Live table reads over HTTP, and which worker of the group holds a key.

``GET /tables`` lists the app's tables; ``GET /tables/<name>/<key>`` answers the value of
``key`` as JSON (a windowed table: the windows this worker knows for the key, open and
closed until they expire; ``?at=<ms>`` the window holding that time). A key is held by the
worker that owns its partition. When the group's workers share a secret
(``FLOWKIT_WEB_SECRET``), each worker with a web endpoint advertises, on the compacted
topic ``<app>-web-endpoints``, its URL and the partitions it holds (again after each
rebalance), signed with that secret; each follows the signed adverts of the others
(``web.endpoints``), and answers a key it does not hold with ``307`` to the owner's URL,
or ``404`` naming the partition when nobody holds it. That is the interactive-query
scheme of Kafka Streams, with the group's own broker as the directory. Without the secret
a worker neither advertises nor redirects.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from aiohttp import web

from ...codecs import DECODE_FAILURES
from ...state import (
    GlobalTable,
    SessionStore,
    SlidingStore,
    Table,
    WindowedStore,
    WindowedTable,
)
from ...transports import Ack, TopicSpec
from .endpoints import (
    SECRET_VAR,
    BadAdvert,
    EndpointDirectory,
    advert_value,
    check_url,
    secret_from_env,
    signed_headers,
)

if TYPE_CHECKING:
    from ..worker import Worker
    from .server import WebServer

__all__ = ["TableQueries", "endpoints_topic"]

log = structlog.get_logger(__name__)

_ADVERTISE_EVERY = 0.5  # seconds between looks at the assignment
# A key in a URL that does not decode, or decodes to a list or an object (no dict key).
_NOT_A_KEY: tuple[type[Exception], ...] = (*DECODE_FAILURES, TypeError)


def endpoints_topic(app_name: str) -> str:
    """The compacted topic where an app's workers advertise their web endpoints."""
    return f"{app_name}-web-endpoints"


class TableQueries:
    """The ``/tables`` routes of one worker, and its advertisement."""

    def __init__(self, worker: Worker, server: WebServer) -> None:
        self.worker = worker
        self.server = server
        self.topic = endpoints_topic(worker.app.name)
        self._task: asyncio.Task[None] | None = None
        self.advertised: list[int] | None = None
        self._advertised_at = 0.0
        # Read when the server is made (not at import): the secret the group signs with.
        self.secret = secret_from_env()
        self.directory: EndpointDirectory | None = None

    def add_routes(self, app: web.Application) -> None:
        """Register the routes on the aiohttp application."""
        app.router.add_get("/tables", self._list)
        app.router.add_get("/tables/{name}/{key}", self._get)

    @property
    def _partitioned(self) -> bool:
        return bool(self.worker.state.partitioned)

    async def start(self) -> None:
        """Advertise this worker's endpoint and follow the others' while it runs (apps
        with partitioned tables, in a group that shares a secret)."""
        if not self._partitioned or self.secret is None:
            return
        transport = self.worker.transport
        await transport.create_topics([TopicSpec(self.topic, 1, compacted=True)])
        self.directory = EndpointDirectory(transport, self.topic, self.secret, self.server.url)
        await self.directory.start()
        try:
            check_url(self.server.url)
        except BadAdvert:  # the others would pass it over: say so once, here
            log.warning(
                "not advertising the web endpoint: other workers take only http://host:port",
                url=self.server.url,
            )
            return
        self._task = asyncio.create_task(self._advertise_loop(), name="web-advertise")

    async def aclose(self) -> None:
        """Stop advertising and following the others' adverts."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.directory is not None:
            await self.directory.aclose()

    async def advertise_gone(self) -> None:
        """Tell the group this endpoint holds nothing (the worker is stopping)."""
        if self.advertised:
            await self._advertise([])

    def owners(self) -> dict[int, str]:
        """partition -> URL of the other worker that advertised it last."""
        return {} if self.directory is None else self.directory.owners()

    # -- advertisement --------------------------------------------------------------------

    def held(self) -> list[int]:
        """Partition numbers this worker holds (of the topics its tables follow)."""
        assignment = self.worker.assignment
        if assignment is None or assignment.rebalancing:
            return self.advertised or []
        return sorted({tp.partition for tp in assignment.assigned})

    async def _advertise_loop(self) -> None:
        while True:
            held = self.held()
            if held != self.advertised and self.worker.publisher is not None:
                try:
                    await self._advertise(held)
                except Exception as exc:  # the broker may be away: try again later
                    log.warning("advertising the web endpoint failed", error=repr(exc))
            await asyncio.sleep(_ADVERTISE_EVERY)

    async def _advertise(self, held: list[int]) -> None:
        publisher = self.worker.publisher
        if publisher is None or self.secret is None:
            return
        url = self.server.url
        # Later than the last one even if the clock stepped back: the newest advert wins.
        at = self._advertised_at = max(time.time(), self._advertised_at + 0.001)
        value, key = advert_value(url, held, at=at), url.encode()
        headers = signed_headers(self.secret, self.topic, key, value)
        ack = await publisher.send_bytes(self.topic, value, key=key, headers=headers)
        if not isinstance(ack, Ack):  # the memory broker stored it already
            await ack
        self.advertised = held

    # -- routes ---------------------------------------------------------------------------

    async def _list(self, request: web.Request) -> web.Response:
        tables = []
        for table in self.worker.app.tables.values():
            kind = (
                "windowed"
                if isinstance(table, WindowedTable)
                else "global"
                if isinstance(table, GlobalTable)
                else "table"
            )
            tables.append(
                {
                    "name": table.name,
                    "kind": kind,
                    "partitions": table.partitions,
                    "url": f"/tables/{table.name}/{{key}}",
                }
            )
        return web.json_response({"app": self.worker.app.name, "tables": tables})

    async def _get(self, request: web.Request) -> web.StreamResponse:
        name, raw = request.match_info["name"], request.match_info["key"]
        table = self.worker.app.tables.get(name)
        if table is None:
            return _error(404, f"no table {name!r}; GET /tables lists them")
        try:
            key = raw if table.key_type is str else msgspec.json.decode(raw, type=table.key_type)
            hash(key)  # a list or an object is no table key
        except _NOT_A_KEY as exc:
            kind = getattr(table.key_type, "__name__", str(table.key_type))
            return _error(400, f"key {raw[:80]!r} is not a {kind}: {exc!r}")
        store = self.worker.state.stores[table]
        if isinstance(table, GlobalTable):
            return self._value(name, key, None, store)
        partition = table.partition_of(key)
        if isinstance(table, WindowedTable) and isinstance(
            store, WindowedStore | SessionStore | SlidingStore
        ):
            if partition in store.owners.owners:
                return self._windows(name, key, partition, store, request.query.get("at"))
        elif isinstance(table, Table) and partition in store.held():
            return self._value(name, key, partition, store)
        if self.directory is None:
            return _error(
                404,
                f"key {raw!r} is in partition {partition}, which this worker does not hold; "
                f"workers redirect to each other only when they share {SECRET_VAR}",
            )
        owner = self.directory.owner(partition)
        if owner is None:
            return _error(
                404, f"key {raw!r} is in partition {partition}, which no worker of the group holds"
            )
        raise web.HTTPTemporaryRedirect(f"{owner}{request.rel_url}")

    def _value(self, name: str, key: Any, partition: int | None, store: Any) -> web.Response:
        missing = object()
        value = store.get(key, missing)
        if value is missing:
            return _error(404, f"table {name!r} has no key {key!r}")
        body = {"table": name, "key": key, "partition": partition, "value": value}
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    def _windows(
        self,
        name: str,
        key: Any,
        partition: int,
        store: WindowedStore | SessionStore | SlidingStore,
        at: str | None,
    ) -> web.Response:
        windows = store.windows(key)
        if at is not None:
            try:
                ms = int(at)
            except ValueError:
                return _error(400, f"at={at!r} is not a time in milliseconds")
            # A session's end is its last record's time, and a sliding window's end is
            # included too.
            last = 1 if isinstance(store, SessionStore | SlidingStore) else 0
            windows = {w: v for w, v in windows.items() if w.start <= ms < w.end + last}
        listed = [{"start": w.start, "end": w.end, "value": v} for w, v in windows.items()]
        body = {"table": name, "key": key, "partition": partition, "windows": listed}
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
