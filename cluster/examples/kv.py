"""A replicated key-value store: :class:`KeyValueService` and :class:`KeyValueClient`
(and ``cluster-kv``, its command line: :mod:`cluster.examples.kv_cli`).

Requests and responses are msgspec Structs encoded with MessagePack; every request has a
client-chosen ``request_id`` that its response echoes, so a client may keep many
requests in flight on one session.  Keys are strings, values bytes.

Writes (``put``, ``delete``, ``compare_and_set``) go through the log.  ``get`` is a
query (``on_query``: no log entry, no disk write; linearizable by default,
``consistency="follower"`` to ask for less: ``docs/queries.md``).  ``watch(prefix)``
streams every change under a prefix from the moment it is registered, in log order, each
once, across leader changes (:mod:`cluster.examples.kv_watch`).

Neither side does anything about leader changes: the session applies each request
exactly once, in the order sent, and delivers each response (and each watch's change)
once, in order, whatever leader changes happen while it is open (issue 42).  So the
client has no resend timer and the service no memory of past responses.

Run it::

    python -m cluster.node --service cluster.examples.kv:KeyValueService

and use it::

    async with client.connect("0=127.0.0.1:9010") as c, KeyValueClient(c) as kv:
        await kv.put("k", b"v")
        assert await kv.get("k") == b"v"
        async with kv.watch("k") as changes:
            async for change in changes:  # KeyChange(key, value, position, timestamp)
                ...

or from a shell: ``cluster-kv --members 0=127.0.0.1:9010:9020:9030 get k``
(``python -m cluster.examples.kv`` runs the same command; ``docs/cluster-kv.md``).
"""

from __future__ import annotations

import itertools
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from ..service import ClientSession, CloseReason, Cluster, ClusteredService
from .kv_watch import (
    DEFAULT_MAX_BUFFERED,
    KeyChange,
    Watcher,
    WatchError,
    WatchLostError,
    WatchOverflowError,
    WatchState,
)

__all__ = [
    "Change",
    "CompareAndSet",
    "Delete",
    "Get",
    "KeyChange",
    "KeyValueClient",
    "KeyValueError",
    "KeyValueService",
    "Put",
    "Response",
    "ResponseLostError",
    "Unwatch",
    "Watch",
    "WatchError",
    "WatchLostError",
    "WatchOverflowError",
    "Watcher",
]

if TYPE_CHECKING:
    import anyio
    import anyio.abc

    from client import ClusterClient


class Put(msgspec.Struct, tag="put", array_like=True):
    """Store ``value`` under ``key``; with ``ttl_ms`` > 0 the key expires after that long
    (a cluster timer: it disappears on every member at the same log position)."""

    request_id: int
    key: str
    value: bytes
    ttl_ms: int = 0


class Get(msgspec.Struct, tag="get", array_like=True):
    request_id: int
    key: str


class Delete(msgspec.Struct, tag="del", array_like=True):
    request_id: int
    key: str


class CompareAndSet(msgspec.Struct, tag="cas", array_like=True):
    """Set ``key`` to ``value`` if its current value is ``expected`` (None = absent)."""

    request_id: int
    key: str
    expected: bytes | None
    value: bytes


class Watch(msgspec.Struct, tag="watch", array_like=True):
    """Send this session a :class:`Change` for every change under ``prefix`` from the
    entry that applies this request on (its ``request_id`` is the watch's id)."""

    request_id: int
    prefix: str


class Unwatch(msgspec.Struct, tag="unwatch", array_like=True):
    """Stop the watch whose ``Watch`` request had the id ``watch_id``."""

    request_id: int
    watch_id: int


Request = Put | Get | Delete | CompareAndSet | Watch | Unwatch


class Response(msgspec.Struct, array_like=True):
    request_id: int
    ok: bool
    value: bytes | None = None
    error: str = ""


class Change(msgspec.Struct, tag="change", array_like=True):
    """A change under the prefix of one or more of the receiving session's watches
    (``watch_ids``): ``key`` now holds ``value`` (None: deleted, or its TTL expired),
    as of the log entry that ends at ``position`` (cluster time ``timestamp``, epoch
    ms).  A session gets one per change, whatever number of its watches it matches."""

    watch_ids: list[int]
    key: str
    value: bytes | None
    position: int
    timestamp: int


_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)
_change_decoder = msgspec.msgpack.Decoder(Change)
_encode = msgspec.msgpack.Encoder().encode
CHANGE_PREFIX = _encode(Change([], "", None, 0, 0))[:8]
"""How every encoded :class:`Change` begins (a 6-element array whose first element is
the tag ``"change"``): a :class:`Response` begins with its request id, an integer, so
the client tells them apart by this alone."""

MAX_WATCHES = 64
"""Watches one session may hold at once; a ``Watch`` past it is refused."""


class KeyValueError(Exception):
    """The service refused a request (bad request bytes, for instance)."""


class ResponseLostError(KeyValueError):
    """The request was applied, but its response never reached this client: the members
    keep a session's unconfirmed responses only up to ``--max-kept-replies`` bytes, and
    more than that were given while the client was away (the oldest went).  A later
    response arrived, so this one is known lost, not late."""


class _Snapshot(msgspec.Struct, array_like=True, tag=3):
    """The service's state (tagged: a snapshot of the first layout starts with a map
    where this one has its tag, so neither is ever read as the other)."""

    store: dict[str, bytes]
    expiries: dict[int, str]  # timer correlation id -> key
    next_timer_id: int
    watches: dict[int, dict[int, str]]  # session id -> watch id -> prefix


class _SnapshotV2(msgspec.Struct, array_like=True, tag=2):
    """The second layout, from before watches: read as having none."""

    store: dict[str, bytes]
    expiries: dict[int, str]
    next_timer_id: int


class _SnapshotV1(msgspec.Struct, array_like=True):
    """The first layout, from when the service remembered each session's recent
    responses (``recent``) to answer a client's resends: still read, that part ignored
    (the session's kept replies do that job now)."""

    store: dict[str, bytes]
    recent: dict[int, dict[int, bytes]]
    expiries: dict[int, str]
    next_timer_id: int


def _read_snapshot(snapshot: bytes) -> _Snapshot:
    try:
        state = msgspec.msgpack.decode(snapshot, type=_Snapshot | _SnapshotV2)
    except msgspec.ValidationError:
        old = msgspec.msgpack.decode(snapshot, type=_SnapshotV1)
        return _Snapshot(old.store, old.expiries, old.next_timer_id, {})
    if isinstance(state, _SnapshotV2):
        return _Snapshot(state.store, state.expiries, state.next_timer_id, {})
    return state


class KeyValueService(ClusteredService):
    """The replicated store: every member applies the same requests in log order.

    Each request is answered once, as it is applied; it remembers no responses: the
    cluster applies a session's request once and keeps the response until the client
    has it, across leader changes.  Keys put with a TTL expire through cluster timers.
    A ``Get`` is answered as a query (:meth:`on_query`, no log entry); one sent through
    the log, as clients before queries did, is still answered.

    **Watches.**  A ``Watch`` request registers (session, prefix) in the state; every
    change under the prefix (a put, a successful compare-and-set, a delete of a key
    that was there, an expiry) then gives that session a :class:`Change`, a reply like
    any other: numbered, kept on every member until the client confirms it, sent again
    by a new leader, so the client sees each change once, in log order.  An
    ``Unwatch``, or the session's close, ends it.  All of it is in the snapshot.
    """

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.requests = 0
        self.bad_requests = 0
        self.expired = 0
        self.watches: dict[int, dict[int, str]] = {}  # session id -> watch id -> prefix
        self._expiries: dict[int, str] = {}
        self._key_timers: dict[str, int] = {}
        self._next_timer_id = 1
        self.cluster: Cluster | None = None

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        self.cluster = cluster
        if snapshot:
            state = _read_snapshot(snapshot)
            self.store = state.store
            self._expiries = state.expiries
            self._key_timers = {key: cid for cid, key in state.expiries.items()}
            self._next_timer_id = state.next_timer_id
            self.watches = state.watches

    def on_take_snapshot(self) -> bytes:
        return _encode(_Snapshot(self.store, self._expiries, self._next_timer_id, self.watches))

    def on_query(self, payload: bytes) -> bytes:
        """Answer a ``Get`` (encoded as for the log) from the store; read-only."""
        request = _request_decoder.decode(payload)
        if not isinstance(request, Get):
            raise ValueError(f"only a Get is a query, not {type(request).__name__}")
        value = self.store.get(request.key)
        return _encode(Response(request.request_id, value is not None, value))

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        key = self._expiries.pop(correlation_id, None)
        if key is not None and self._key_timers.get(key) == correlation_id:
            del self._key_timers[key]
            if self.store.pop(key, None) is not None:
                self.expired += 1
                self._changed(key, None, timestamp)

    def on_session_close(
        self, session: ClientSession, timestamp: int, close_reason: CloseReason
    ) -> None:
        self.watches.pop(session.id, None)

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        if session is None:
            return  # this service offers no service messages
        self.requests += 1
        try:
            request = _request_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.bad_requests += 1
            rid = _request_id_of(payload)
            session.offer(_encode(Response(rid, False, None, f"bad request: {exc}")))
            return
        if isinstance(request, Watch | Unwatch):
            session.offer(_encode(self._watch(session.id, request)))
            return
        session.offer(_encode(self.apply(request, timestamp)))

    def _watch(self, session_id: int, request: Watch | Unwatch) -> Response:
        watches = self.watches.get(session_id, {})
        if isinstance(request, Unwatch):
            found = watches.pop(request.watch_id, None) is not None
            if not watches:
                self.watches.pop(session_id, None)
            return Response(request.request_id, found)
        if len(watches) >= MAX_WATCHES:
            return Response(
                request.request_id, False, None, f"at most {MAX_WATCHES} watches per session"
            )
        watches[request.request_id] = request.prefix
        self.watches[session_id] = watches
        return Response(request.request_id, True)

    def _changed(self, key: str, value: bytes | None, timestamp: int) -> None:
        """Tell every session watching a prefix of ``key`` (a reply to each, given while
        this entry is applied: numbered and kept like every reply)."""
        if not self.watches:
            return
        cluster = self.cluster
        position = cluster.log_position if cluster is not None else 0
        gone: list[int] = []
        for session_id, watches in self.watches.items():
            ids = [wid for wid, prefix in watches.items() if key.startswith(prefix)]
            if not ids:
                continue
            session = cluster.get_client_session(session_id) if cluster is not None else None
            if session is None:
                gone.append(session_id)  # closed without on_session_close: forget it
                continue
            session.offer(_encode(Change(ids, key, value, position, timestamp)))
        for session_id in gone:
            del self.watches[session_id]

    def _forget_timer(self, key: str) -> None:
        correlation_id = self._key_timers.pop(key, None)
        if correlation_id is not None:
            self._expiries.pop(correlation_id, None)
            if self.cluster is not None:
                self.cluster.cancel_timer(correlation_id)

    def apply(self, request: Put | Get | Delete | CompareAndSet, timestamp: int = 0) -> Response:
        store = self.store
        if isinstance(request, Put):
            store[request.key] = request.value
            self._forget_timer(request.key)
            if request.ttl_ms > 0 and self.cluster is not None:
                correlation_id = self._next_timer_id
                self._next_timer_id += 1
                self._expiries[correlation_id] = request.key
                self._key_timers[request.key] = correlation_id
                self.cluster.schedule_timer(correlation_id, timestamp + request.ttl_ms)
            self._changed(request.key, request.value, timestamp)
            return Response(request.request_id, True)
        if isinstance(request, Get):  # a client from before queries: through the log
            value = store.get(request.key)
            return Response(request.request_id, value is not None, value)
        if isinstance(request, Delete):
            self._forget_timer(request.key)
            if store.pop(request.key, None) is None:
                return Response(request.request_id, False)
            self._changed(request.key, None, timestamp)
            return Response(request.request_id, True)
        current = store.get(request.key)
        if current != request.expected:
            return Response(request.request_id, False, current)
        store[request.key] = request.value
        self._changed(request.key, request.value, timestamp)
        return Response(request.request_id, True, request.value)


def _request_id_of(payload: bytes) -> int:
    """The request id of a request the service cannot decode, if it has one where a
    request keeps it (``-1`` otherwise), so that its sender hears why."""
    try:
        fields = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return -1
    if isinstance(fields, list) and len(fields) > 1 and type(fields[1]) is int:
        return fields[1] if -(1 << 63) <= fields[1] < 1 << 63 else -1
    return -1


class KeyValueClient:
    """Typed requests over a :class:`client.ClusterClient`, many in flight at once.

    Use as an async context manager: it runs a task that matches responses to requests
    by ``request_id``.  Each request is sent once and waits for its response: the
    session applies it exactly once and delivers the response once, in order, whatever
    leader changes happen meanwhile, so there is nothing to resend and no duplicate to
    filter.  The ids are correlation ids for the many requests in flight, not for
    leader changes; they also make a response dropped past ``--max-kept-replies`` fail
    its own request (:class:`ResponseLostError`) where matching responses by their order
    alone would hand every later response to the wrong request.  Where the service
    raised on a request, that request raises :class:`client.ServiceError` (matched by
    the request it carries back); the session and every other request go on.

    :meth:`get` is a query (no log entry, no disk write: ``docs/queries.md``);
    :meth:`watch` streams the changes under a prefix.  The same task takes the watches'
    changes apart from the responses (a :class:`Change` is not a response and never
    moves the matching of responses to requests).
    """

    def __init__(self, cluster_client: ClusterClient, *, timeout: float | None = None) -> None:
        """``timeout``: stop waiting for a response after this long (``TimeoutError``; the
        request may still be applied, and its response is then dropped when it comes);
        None waits as long as the session lives."""
        self.client = cluster_client
        self.timeout = timeout
        self.unmatched = 0  # responses no request waited for (it timed out, or a bug)
        self.stray_changes = 0  # changes for no open watch (one closed meanwhile)
        self._ids = itertools.count(1)
        self._sent: deque[int] = deque()  # ids offered, in order, whose response is due
        self._quiet: set[int] = set()  # ids offered whose response nobody waits for
        self._send_lock: anyio.Lock | None = None
        self._waiting: dict[int, Any] = {}
        self._results: dict[int, Response] = {}
        self._failures: dict[int, Exception] = {}
        self._watches: dict[int, WatchState] = {}
        self._dropped_seen = 0
        self._error: BaseException | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> KeyValueClient:
        import anyio

        self._send_lock = anyio.Lock()
        self._dropped_seen = self.client.replies_dropped
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._receive_loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:  # the caller's own error comes out as itself
            from client._exception_groups import raise_unwrapped

            raise_unwrapped(group, exc)
        finally:
            self._tg = None
            self._closed = True
            for state in self._watches.values():
                state.fail(KeyValueError("the KeyValueClient is closed"))

    async def _receive_loop(self) -> None:
        from client import ServiceError

        client = self.client
        try:
            while True:
                try:
                    payload = await client.receive()
                except ServiceError as exc:  # the service raised on one request: its own
                    request_id = _request_id_of(exc.request)
                    event = self._answered(request_id)
                    if event is not None:
                        self._failures[request_id] = exc
                        event.set()
                    continue
                if client.replies_dropped != self._dropped_seen:
                    self._replies_dropped(client.replies_dropped)
                if payload.startswith(CHANGE_PREFIX):
                    self._change(_change_decoder.decode(payload))
                    continue
                response = _response_decoder.decode(payload)
                event = self._answered(response.request_id)
                if event is not None:
                    self._results[response.request_id] = response
                    event.set()
        except Exception as exc:  # wake every waiter with the cause
            self._error = exc
            for event in self._waiting.values():
                event.set()
            self._waiting.clear()
            for state in self._watches.values():
                state.fail(exc)

    def _change(self, change: Change) -> None:
        """Hand a change to each of its watches (never waits: see :mod:`.kv_watch`)."""
        item = KeyChange(change.key, change.value, change.position, change.timestamp)
        for watch_id in change.watch_ids:
            state = self._watches.get(watch_id)
            if state is None:
                self.stray_changes += 1
            else:
                state.push(item)

    def _replies_dropped(self, dropped: int) -> None:
        """Replies to the session were dropped: any of them may have been a change, so
        every watch stops (a request whose response went fails by itself)."""
        count, self._dropped_seen = dropped - self._dropped_seen, dropped
        for state in self._watches.values():
            state.fail(WatchLostError(state.prefix, count, state.last_position))

    def _answered(self, request_id: int) -> Any:
        """Take the waiter of request ``request_id``, whose response came (None if none
        waits).  Responses come in the order the requests were offered, so a request
        offered before it and still due will get none: its response was dropped (more
        than ``--max-kept-replies`` were given while the client was away), and it fails
        with :class:`ResponseLostError` rather than wait for ever."""
        sent = self._sent
        if sent and sent[0] == request_id:
            sent.popleft()
        elif request_id in sent:
            while (lost := sent.popleft()) != request_id:
                self._quiet.discard(lost)
                event = self._waiting.pop(lost, None)
                if event is not None:
                    self._failures[lost] = ResponseLostError(
                        f"request {lost} was applied, but its response was dropped: more "
                        "than --max-kept-replies of this session's responses were given "
                        "while the client was away"
                    )
                    event.set()
        else:  # not ours, or a second response: the contract sends none
            self.unmatched += 1
            return None
        event = self._waiting.pop(request_id, None)
        if event is None and request_id in self._quiet:
            self._quiet.discard(request_id)  # nobody waits for it, by design
        elif event is None:  # it timed out, or was cancelled
            self.unmatched += 1
        return event

    def _check_open(self) -> None:
        if self._tg is None or self._send_lock is None:
            raise RuntimeError(
                "KeyValueClient "
                + ("is closed" if self._closed else "must be entered first")
                + ": use `async with KeyValueClient(c) as kv:` (it reads the responses)"
            )
        if self._error is not None:
            raise self._error

    async def request(self, build: Any, *args: Any) -> Response:
        """Send ``build(request_id, *args)`` through the log; return its response."""
        return await self._request(build, args)

    async def _request(
        self, build: Any, args: tuple[Any, ...], on_id: Any = None, *, quiet: bool = False
    ) -> Response:
        """The request, with ``on_id(request_id)`` called before it is offered; with
        ``quiet``, return once it is offered, its response ignored (not a Response)."""
        import anyio

        self._check_open()
        assert self._send_lock is not None
        event = anyio.Event()
        request_id = 0
        try:
            with anyio.fail_after(self.timeout):
                async with self._send_lock:  # offered in id order: the responses come so
                    request_id = next(self._ids)
                    payload = _encode(build(request_id, *args))
                    try:  # what the service would refuse is refused here, before it is sent
                        _request_decoder.decode(payload)
                    except msgspec.ValidationError as exc:
                        raise TypeError(f"bad {build.__name__} request: {exc}") from None
                    if on_id is not None:
                        on_id(request_id)
                    if quiet:
                        self._quiet.add(request_id)
                    else:
                        self._waiting[request_id] = event
                    self._sent.append(request_id)
                    await self.client.offer(payload)
                if quiet:
                    return Response(request_id, True)
                await event.wait()
        except TimeoutError:
            raise TimeoutError(
                f"no response to {build.__name__} request {request_id} within {self.timeout:g} s"
            ) from None
        finally:
            self._waiting.pop(request_id, None)
        failure = self._failures.pop(request_id, None)
        if failure is not None:
            raise failure  # client.ServiceError, ResponseLostError: the session goes on
        response = self._results.pop(request_id, None)
        if response is None:
            raise self._error or KeyValueError("no response")
        if response.error:
            raise KeyValueError(response.error)
        return response

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> None:
        """Store ``value``; with ``ttl`` (seconds) the key expires on every member."""
        await self.request(Put, key, value, int(ttl * 1000) if ttl else 0)

    async def get(self, key: str, *, consistency: str = "linearizable") -> bytes | None:
        """The value of ``key`` (None: absent), as a query: no log entry, no disk write.

        ``consistency``: ``"linearizable"`` (the default: the leader answers once it has
        confirmed it still leads, and reflects every write acknowledged before the call)
        or ``"follower"`` (never older than what this client has seen); see
        ``docs/queries.md``.  Raises :class:`client.ServiceError` if the service cannot
        answer it, ``TimeoutError`` past ``timeout``."""
        import anyio

        self._check_open()
        if type(key) is not str:
            raise TypeError(f"bad Get request: a key is a str, not {type(key).__name__}")
        try:
            with anyio.fail_after(self.timeout):
                answer = await self.client.query(_encode(Get(0, key)), consistency=consistency)
        except TimeoutError:
            raise TimeoutError(f"no answer to get {key!r} within {self.timeout:g} s") from None
        response = _response_decoder.decode(answer)
        if response.error:
            raise KeyValueError(response.error)
        return response.value

    async def delete(self, key: str) -> bool:
        return (await self.request(Delete, key)).ok

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        return (await self.request(CompareAndSet, key, expected, value)).ok

    def watch(self, prefix: str, *, max_buffered: int = DEFAULT_MAX_BUFFERED) -> Watcher:
        """Every change under ``prefix`` (``""``: every key) from the moment the watch is
        registered, in log order, each once (``KeyChange``: key, value or None for a
        deletion or expiry, log position, cluster time)::

            async with kv.watch("config/") as changes:
                async for change in changes:
                    ...

        ``max_buffered``: changes held for a consumer that has not taken them; past it
        the watch fails with :class:`WatchOverflowError` (the responses to other
        requests never wait for it).  See :class:`~cluster.examples.kv_watch.Watcher`."""
        return Watcher(self, prefix, max_buffered)

    async def _start_watch(self, state: WatchState) -> int:
        """Register ``state`` and its ``Watch`` request; the watch's id once applied."""
        ids: list[int] = []

        def register(request_id: int) -> None:
            ids.append(request_id)
            self._watches[request_id] = state  # before any change for it can come

        try:
            await self._request(Watch, (state.prefix,), register)
        except BaseException:
            if ids:
                self._watches.pop(ids[0], None)
                await self._stop_watch(ids[0])  # in case it was applied after all
            raise
        return ids[0]

    async def _stop_watch(self, watch_id: int) -> None:
        """Forget watch ``watch_id`` here and ask the service to (not waiting for its
        answer); nothing to ask once the session or this client is closed."""
        import anyio

        self._watches.pop(watch_id, None)
        if self._tg is None or self._error is not None or self.client.is_closed:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
            await self._request(Unwatch, (watch_id,), quiet=True)


if __name__ == "__main__":  # python -m cluster.examples.kv: the cluster-kv command
    import runpy

    runpy.run_module("cluster.examples.kv_cli", run_name="__main__")
