"""A replicated key-value store: :class:`KeyValueService` and :class:`KeyValueClient`.

Requests and responses are msgspec Structs encoded with MessagePack; every request has a
client-chosen ``request_id`` that its response echoes, so a client may keep many
requests in flight on one session.  Keys are strings, values bytes.

Neither side does anything about leader changes: the session applies each request
exactly once, in the order sent, and delivers each response once, in order, whatever
leader changes happen while it is open (issue 42).  So the client has no resend timer
and the service no memory of past responses.

Run it::

    python -m cluster.node --service cluster.examples.kv:KeyValueService

and use it::

    async with client.connect("0=127.0.0.1:9010") as c, KeyValueClient(c) as kv:
        await kv.put("k", b"v")
        assert await kv.get("k") == b"v"
"""

from __future__ import annotations

import itertools
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from ..service import ClientSession, Cluster, ClusteredService

if TYPE_CHECKING:
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


Request = Put | Get | Delete | CompareAndSet


class Response(msgspec.Struct, array_like=True):
    request_id: int
    ok: bool
    value: bytes | None = None
    error: str = ""


_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)
_encode = msgspec.msgpack.Encoder().encode


class KeyValueError(Exception):
    """The service refused a request (bad request bytes, for instance)."""


class ResponseLostError(KeyValueError):
    """The request was applied, but its response never reached this client: the members
    keep a session's unconfirmed responses only up to ``--max-kept-replies`` bytes, and
    more than that were given while the client was away (the oldest went).  A later
    response arrived, so this one is known lost, not late."""


class _Snapshot(msgspec.Struct, array_like=True, tag=2):
    """The service's state (tagged: a snapshot of the first layout starts with a map
    where this one has its tag, so neither is ever read as the other)."""

    store: dict[str, bytes]
    expiries: dict[int, str]  # timer correlation id -> key
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
        return msgspec.msgpack.decode(snapshot, type=_Snapshot)
    except msgspec.ValidationError:
        old = msgspec.msgpack.decode(snapshot, type=_SnapshotV1)
        return _Snapshot(old.store, old.expiries, old.next_timer_id)


class KeyValueService(ClusteredService):
    """The replicated store: every member applies the same requests in log order.

    Each request is answered once, as it is applied; it remembers no responses: the
    cluster applies a session's request once and keeps the response until the client
    has it, across leader changes.  Keys put with a TTL expire through cluster timers.
    All of it is in the snapshot.
    """

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.requests = 0
        self.bad_requests = 0
        self.expired = 0
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

    def on_take_snapshot(self) -> bytes:
        return _encode(_Snapshot(self.store, self._expiries, self._next_timer_id))

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        key = self._expiries.pop(correlation_id, None)
        if key is not None and self._key_timers.get(key) == correlation_id:
            del self._key_timers[key]
            if self.store.pop(key, None) is not None:
                self.expired += 1

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
        session.offer(_encode(self.apply(request, timestamp)))

    def _forget_timer(self, key: str) -> None:
        correlation_id = self._key_timers.pop(key, None)
        if correlation_id is not None:
            self._expiries.pop(correlation_id, None)
            if self.cluster is not None:
                self.cluster.cancel_timer(correlation_id)

    def apply(self, request: Request, timestamp: int = 0) -> Response:
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
            return Response(request.request_id, True)
        if isinstance(request, Get):
            value = store.get(request.key)
            return Response(request.request_id, value is not None, value)
        if isinstance(request, Delete):
            self._forget_timer(request.key)
            return Response(request.request_id, store.pop(request.key, None) is not None)
        current = store.get(request.key)
        if current != request.expected:
            return Response(request.request_id, False, current)
        store[request.key] = request.value
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
    """

    def __init__(self, cluster_client: ClusterClient, *, timeout: float | None = None) -> None:
        """``timeout``: stop waiting for a response after this long (``TimeoutError``; the
        request may still be applied, and its response is then dropped when it comes);
        None waits as long as the session lives."""
        self.client = cluster_client
        self.timeout = timeout
        self.unmatched = 0  # responses no request waited for (it timed out, or a bug)
        self._ids = itertools.count(1)
        self._sent: deque[int] = deque()  # ids offered, in order, whose response is due
        self._send_lock: anyio.Lock | None = None
        self._waiting: dict[int, Any] = {}
        self._results: dict[int, Response] = {}
        self._failures: dict[int, Exception] = {}
        self._error: BaseException | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> KeyValueClient:
        import anyio

        self._send_lock = anyio.Lock()
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

    async def _receive_loop(self) -> None:
        from client import ServiceError

        try:
            while True:
                try:
                    payload = await self.client.receive()
                except ServiceError as exc:  # the service raised on one request: its own
                    request_id = _request_id_of(exc.request)
                    event = self._answered(request_id)
                    if event is not None:
                        self._failures[request_id] = exc
                        event.set()
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
        if event is None:  # it timed out, or was cancelled
            self.unmatched += 1
        return event

    async def request(self, build: Any, *args: Any) -> Response:
        import anyio

        if self._tg is None or self._send_lock is None:
            raise RuntimeError(
                "KeyValueClient "
                + ("is closed" if self._closed else "must be entered first")
                + ": use `async with KeyValueClient(c) as kv:` (it reads the responses)"
            )
        if self._error is not None:
            raise self._error
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
                    self._waiting[request_id] = event
                    self._sent.append(request_id)
                    await self.client.offer(payload)
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

    async def get(self, key: str) -> bytes | None:
        return (await self.request(Get, key)).value

    async def delete(self, key: str) -> bool:
        return (await self.request(Delete, key)).ok

    async def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        return (await self.request(CompareAndSet, key, expected, value)).ok
