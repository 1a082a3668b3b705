"""A simulated key-value client: the real sans-IO connect handshake over a SimNetwork.

The real client library (``client._client``) runs on anyio sockets, which cannot ride
the simulated network, so this small shell drives :class:`client._connect.AsyncConnect`
(the production handshake state machine) over :class:`~cluster.transport.sim.SimHost`:

* it listens for egress on its own sim host (members dial its response channel), or,
  with ``own_egress``, takes its egress on its ingress connection: after a break it
  resumes at the leader, then at each other member in turn, follows REDIRECTs, waits
  while a member says an election is on, and sends nothing until the leader has taken
  its resume (its NewLeaderEvent);
* connects: ``SessionConnectRequest`` with its credentials (answering a challenge),
  follows ``REDIRECT``;
* sends :class:`cluster.examples.kv.Put` requests with unique keys and values in
  ``SessionMessageHeader`` envelopes, a few in flight at once;
* follows ``NewLeaderEvent`` (ingress moves to the new leader, the session stays);
* numbers its session's messages and keeps them until the cluster confirms them
  (:class:`client._outbox.Outbox`, the real client's), sending the rest again when a
  leader asks (a ``SessionAck`` with ``resend``): exactly once in (issue 42);
* takes the service's numbered replies as the real client does
  (:meth:`client._session.Session.on_egress`): a number it has received is a duplicate
  and dropped, a number past the next is a gap (counted), and every message it sends
  says how far it received (``reply``): exactly once out;
* offers each request once on a session, with no timer of its own: the session's
  contract delivers it and its reply whatever leader changes happen.  Only when a
  session is lost (closed by the cluster, or unreachable) does it offer what is still
  unanswered again on the next one, with the **same** request id, key and value (the
  first attempt is then *indeterminate*);
* with ``query_share``, makes that share of its operations queries of a key written
  lately (or never), without the log, at both consistency levels, asked again as the
  real client asks them (:mod:`tests.sim.queries`): linearizable ones on the session's
  connection, follower ones in turn at every member over query connections
  (:mod:`tests.sim.sim_follower`).

Every request is recorded in a shared :class:`History` with virtual timestamps, and
every reply the application saw (each session's, in order) in ``History.delivered``.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from client._connect import AsyncConnect, ConnectIngress, ConnectState, Done, Fail, SendMessage
from client._credentials import CredentialsSupplier, StaticCredentials
from client._endpoints import Endpoint, parse_endpoints
from client._outbox import Outbox
from cluster.examples.kv import Put, Response
from cluster.protocol import EGRESS, FrameDecoder, ProtocolError, encode_frame
from cluster.protocol.egress import (
    AdminResponse,
    NewLeaderEvent,
    QueryResponse,
    ServiceErrorEvent,
    SessionAck,
    SessionEvent,
)
from cluster.protocol.enums import AdminRequestType, EventCode
from cluster.protocol.ingress import (
    QUERY_FOLLOWER,
    QUERY_LINEARIZABLE,
    AdminRequest,
    QueryRequest,
    SessionKeepAlive,
    SessionMessageHeader,
    SessionResumeRequest,
)
from cluster.protocol.version import PROTOCOL_VERSION
from cluster.transport.sim import SimNetwork

from .queries import Answer, ClientQueries, QueryOp
from .sim_follower import SimFollowerReads

_encode = msgspec.msgpack.Encoder().encode
_decode_response = msgspec.msgpack.Decoder(Response).decode

_NETWORK_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)

Trace = Callable[..., None]


@dataclass
class Op:
    """One client write and what became of it."""

    request_id: int
    client: int
    key: str
    value: bytes
    invoked_at: float
    acked_at: float | None = None
    sends: int = 0
    """How often it was offered: once on each session it was offered on."""
    offered_at: float = -1.0
    sessions: list[int] = field(default_factory=list)

    @property
    def acked(self) -> bool:
        return self.acked_at is not None


@dataclass
class History:
    """Every operation of every client, by request id (insertion ordered)."""

    ops: dict[int, Op] = field(default_factory=dict)
    bad_responses: list[str] = field(default_factory=list)
    offered: dict[int, list[bytes]] = field(default_factory=dict)
    """Each session's messages in the order its client numbered them (sequence 1 first)."""
    closed_told: dict[int, int] = field(default_factory=dict)
    """The last applied sequence each session's CLOSED told its client."""
    delivered: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    """Each session's replies its application got, in that order: (number, payload)."""
    duplicate_replies: int = 0
    """Replies dropped as numbered like one already received (a new leader's, a resume's)."""
    reply_gaps: dict[int, int] = field(default_factory=dict)
    """Each session's replies it never got (skipped numbers: dropped by the kept bound)."""
    queries: list[QueryOp] = field(default_factory=list)
    """Every query of every client, in the order they were asked."""
    recent_keys: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    """The keys of the latest writes (of any client): what the queries ask for."""
    answered_by: dict[int, int] = field(default_factory=dict)
    """member -> the follower queries it answered OK first (over a query connection)."""

    @property
    def acked(self) -> list[Op]:
        return [op for op in self.ops.values() if op.acked]

    def summary(self) -> str:
        ops = list(self.ops.values())
        acked = sum(op.acked for op in ops)
        retried = sum(op.sends > 1 for op in ops)
        replies = sum(map(len, self.delivered.values()))
        answered = sum(q.answered_at is not None for q in self.queries)
        by = ", ".join(f"m{m}: {n}" for m, n in sorted(self.answered_by.items()))
        return (
            f"{len(ops)} writes, {acked} acknowledged, {retried} offered again on a new "
            f"session, {replies} replies delivered, {self.duplicate_replies} duplicates "
            f"dropped, {len(self.queries)} queries, {answered} answered "
            f"(follower queries by member: {by or 'none'})"
        )


class SessionLost(Exception):
    pass


class SimClient:
    """One client session (re-opened as needed) issuing writes until stopped."""

    def __init__(
        self,
        index: int,
        net: SimNetwork,
        endpoints: str,
        rng: random.Random,
        history: History,
        *,
        trace: Trace | None = None,
        connect_timeout: float = 3.0,
        keepalive_interval: float = 0.5,
        window: int = 2,
        think: tuple[float, float] = (0.0, 0.05),
        max_ops: int | None = None,
        leader_retry_time: float = 2.0,
        egress_silence: float | None = 3.0,
        own_egress: bool = False,
        credentials: CredentialsSupplier | None = None,
        query_share: float = 0.0,
        committed: Callable[[], int] | None = None,
        on_answer: Callable[[Answer], None] | None = None,
    ) -> None:
        self.query_share = query_share
        self._committed = committed
        """The highest commit position of any member now (the harness's: (9))."""
        self._on_answer = on_answer
        self.own_egress = own_egress
        self.credentials = credentials if credentials is not None else StaticCredentials()
        self._confirmed = True  # the ingress connection is the leader's (own_egress)
        self._redial_leader = False  # a member named the leader: dial it (own_egress)
        self.index = index
        self.name = f"c{index}"
        self.host = net.host(self.name)
        self.endpoints: dict[int, Endpoint] = parse_endpoints(endpoints)
        self.rng = rng
        self.history = history
        self._trace = trace
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self.window = window
        self.think = think
        self.max_ops = max_ops
        self.leader_retry_time = leader_retry_time
        self.egress_silence = egress_silence
        self.response_channel = ""
        self._correlation_ids = itertools.count(index * 1_000_000 + 1)
        self._op_numbers = itertools.count()
        # session
        self.session_id = -1
        self.session_secret = b""
        self.term = -1
        self.leader_id = -1
        self.sessions_opened = 0
        self._session_lost = False
        self.outbox = Outbox()
        self._resend_after: int | None = None  # a leader asked for what follows this
        self.received_reply = 0  # the highest reply number received in order
        # ingress
        self._ingress: trio.abc.Stream | None = None
        self._ingress_member = -1
        self._last_send = -1.0
        self._last_heard = -1.0
        # connect handshake
        self._ac: AsyncConnect | None = None
        self._ac_actions: list[Any] = []
        self._ac_wake = trio.Event()
        # work
        self.outstanding: dict[int, Op] = {}
        self.stopping = False
        self.snapshot_requested = False
        self.admin_responses: list[str] = []
        self._wake = trio.Event()
        self.ops_started = 0
        self.queries = ClientQueries(index)
        self.follower_reads = SimFollowerReads(self)
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ plumbing

    def trace(self, kind: str, *detail: Any) -> None:
        if self._trace is not None:
            self._trace(self.name, kind, *detail)

    def request_snapshot(self) -> None:
        """Send an AdminRequest SNAPSHOT on the session as soon as it is open."""
        self.snapshot_requested = True
        self._wake.set()

    def stop(self) -> None:
        """Issue no new writes (outstanding ones still get their replies)."""
        self.stopping = True
        self._wake.set()

    @property
    def done(self) -> bool:
        return (
            self.max_ops is not None
            and self.ops_started >= self.max_ops
            and not self.outstanding
            and not self.queries
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.own_egress:
                self.response_channel = ""  # egress on the ingress connection
            else:
                port = await nursery.start(self.host.serve, self.name, 0, self._egress_handler)
                self.response_channel = f"{self.name}:{port}"
            task_status.started()
            while not self.done:
                if not await self._connect(nursery):
                    await trio.sleep(self.rng.uniform(0.05, 0.3))
                    continue
                try:
                    await self._work(nursery)
                except SessionLost as exc:
                    self.trace("session-lost", self.session_id, str(exc))
                    self.session_id = -1
                    await self._drop_ingress()
            nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ egress

    async def _egress_handler(self, stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder()
        try:
            while data := await stream.receive_some():
                for body in decoder.feed(data):
                    self._on_egress(EGRESS.decode(body))
        except (*_NETWORK_ERRORS, ProtocolError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    def _on_egress(self, message: Any) -> None:
        ac = self._ac
        if ac is not None and ac.state is not ConnectState.DONE:
            actions = ac.on_egress_message(message)
            if actions:
                self._ac_actions.extend(actions)
                self._ac_wake.set()
                return
        if getattr(message, "cluster_session_id", None) == self.session_id:
            self._last_heard = trio.current_time()
        if type(message) is SessionMessageHeader or type(message) is ServiceErrorEvent:
            if message.cluster_session_id == self.session_id >= 0:
                if type(message) is SessionMessageHeader:
                    self.outbox.confirm(message.sequence)
                self._on_reply(message)
        elif isinstance(message, SessionAck):
            if message.cluster_session_id == self.session_id and self.session_id >= 0:
                self.outbox.confirm(message.applied)
                if message.resend and message.leadership_term_id >= self.term:
                    self.trace("resend", message.logged, self.outbox.sequence)
                    self._resend_after = message.logged
                    self._wake.set()
        elif isinstance(message, NewLeaderEvent):
            if message.cluster_session_id == self.session_id and self.session_id >= 0:
                self.trace("new-leader", message.leadership_term_id, message.leader_member_id)
                self.term = message.leadership_term_id
                self.leader_id = message.leader_member_id
                if self.own_egress and self._ingress_member == self.leader_id:
                    self._confirmed = True  # the leader took the resume
                try:
                    self.endpoints = parse_endpoints(message.ingress_endpoints)
                except ValueError:
                    pass
                if self._ingress_member != self.leader_id:
                    self._ingress_member = -1  # re-dial the new leader
                self.queries.ask_again_now(trio.current_time())  # the real client's wake_all
                self._wake.set()
        elif type(message) is QueryResponse:
            self._on_query_response(message)
        elif isinstance(message, AdminResponse):
            if message.cluster_session_id == self.session_id:
                self.admin_responses.append(message.response_code.name)
                self.trace("admin-response", message.response_code.name, message.message)
        elif (
            isinstance(message, SessionEvent)
            and message.code is EventCode.REDIRECT
            and message.cluster_session_id == self.session_id >= 0
        ):
            # a member that does not lead names the leader (none: an election is on,
            # it will say who wins): a new one, or the one this client has (which it
            # could not reach or went silent), to dial again (the real client's Redial)
            leader = message.leader_member_id
            term = message.leadership_term_id
            if leader >= 0 and term >= self.term:
                if leader != self.leader_id or term > self.term:
                    self.trace("redirect", message.leadership_term_id, leader)
                    self.term = message.leadership_term_id
                    self.leader_id = leader
                    self._redial_leader = True
                elif self._ingress_member != leader:
                    self._redial_leader = True
            self._wake.set()
        elif isinstance(message, SessionEvent) and (
            message.cluster_session_id == self.session_id
            and self.session_id >= 0
            and message.code in (EventCode.CLOSED, EventCode.ERROR)
        ):
            self.trace("session-event", message.code.name, message.detail)
            if message.code is EventCode.CLOSED and message.detail not in ("SHUTDOWN", "ABORT"):
                # closed by an entry of the log (SHUTDOWN and ABORT append none)
                self.history.closed_told[self.session_id] = message.last_applied
            self._session_lost = True
            self._wake.set()

    def _on_query_response(self, message: QueryResponse) -> None:
        """The answer to a query (any send of it, on any session of this client's):
        checked at once if OK, else asked again later (NOT_LEADER, BUSY)."""
        now = trio.current_time()
        commit = self._committed() if self._committed is not None else 0
        answer, wrong = self.queries.on_response(message, now, commit)
        self.trace(
            "query-answer", message.correlation_id, message.status.name, message.log_position
        )
        if wrong is not None:
            self.history.bad_responses.append(f"{self.name}: {wrong}")
        if answer is not None and self._on_answer is not None:
            self._on_answer(answer)
        self._wake.set()

    def _new_query(self) -> QueryOp:
        """A query of a key written lately (by any client), or now and then of one never
        written; linearizable or follower, half each."""
        keys = self.history.recent_keys
        if keys and self.rng.random() < 0.9:
            key = keys[self.rng.randrange(len(keys))]
        else:
            key = f"{self.name}-never-{self.rng.getrandbits(16)}"
        level = QUERY_LINEARIZABLE if self.rng.random() < 0.5 else QUERY_FOLLOWER
        query = QueryOp(self.index, next(self._correlation_ids), key, level, trio.current_time())
        self.history.queries.append(query)
        self.queries.add(query)
        if level == QUERY_FOLLOWER and self._nursery is not None:
            self.follower_reads.start(self._nursery, query)  # to every member in turn
        self.ops_started += 1
        return query

    def _room(self) -> bool:
        """Is there room for a new operation (a write, or a query if it asks them)?"""
        return len(self.outstanding) < self.window or (
            bool(self.query_share) and len(self.queries) < self.window
        )

    async def _send_queries(self) -> None:
        """Send (again) every query that is due, on this session's connection."""
        for query in self.queries.due(trio.current_time()):
            if query.correlation_id not in self.queries.waiting:
                continue  # answered while an earlier one was sent
            commit = self._committed() if self._committed is not None else 0
            seen = self.queries.seen_position
            request = QueryRequest(
                self.term,
                self.session_id,
                query.correlation_id,
                query.key.encode(),
                query.consistency,
                seen,
            )
            member = self._ingress_member
            if not await self._send(request):
                return  # asked again on the next connection
            self.queries.sent(query, trio.current_time(), commit, seen, member)
            self.trace("query", query.correlation_id, query.level, query.key, query.sends)

    def _on_reply(self, message: SessionMessageHeader | ServiceErrorEvent) -> None:
        """A reply to this session, as the real client takes it (``Session.on_egress``):
        a number received already is dropped, one past the next leaves a gap."""
        number, session_id = message.reply, self.session_id
        if number <= 0:
            # the KV service replies only while applying the log: every reply numbered
            self.history.bad_responses.append(f"{self.name}: unnumbered reply {message!r:.200}")
            return
        if number <= self.received_reply:
            self.history.duplicate_replies += 1
            self.trace("reply-duplicate", session_id, number)
            return
        if number != self.received_reply + 1:
            gaps = self.history.reply_gaps
            gaps[session_id] = gaps.get(session_id, 0) + number - self.received_reply - 1
            self.trace("reply-gap", session_id, self.received_reply, number)
        self.received_reply = number
        if isinstance(message, ServiceErrorEvent):
            self.history.delivered[session_id].append((number, b""))
            self.history.bad_responses.append(f"{self.name}: service error {message!r:.200}")
            return
        self.history.delivered[session_id].append((number, message.payload))
        self._on_response(message)

    def _on_response(self, message: SessionMessageHeader) -> None:
        try:
            response = _decode_response(message.payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.history.bad_responses.append(f"{self.name}: undecodable response: {exc}")
            return
        op = self.history.ops.get(response.request_id)
        if op is None or op.client != self.index:
            self.history.bad_responses.append(f"{self.name}: response to unknown {response}")
            return
        if not response.ok or response.error:
            self.history.bad_responses.append(f"{self.name}: refused {response}")
            return
        if op.acked_at is not None:  # offered once per session, answered once
            self.history.bad_responses.append(f"{self.name}: answered twice {response}")
            return
        op.acked_at = trio.current_time()
        self.trace("ack", op.request_id, message.cluster_session_id)
        self.outstanding.pop(op.request_id, None)
        self._wake.set()

    # ------------------------------------------------------------------ ingress

    async def _drop_ingress(self) -> None:
        stream, self._ingress = self._ingress, None
        self._ingress_member = -1
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _dial(self, member: int) -> trio.abc.Stream | None:
        endpoint = self.endpoints.get(member)
        if endpoint is None:
            return None
        try:
            return await self.host.open_stream(endpoint.host, endpoint.port)
        except OSError:
            return None

    async def _use_ingress(
        self, nursery: trio.Nursery, member: int, stream: trio.abc.Stream
    ) -> None:
        await self._drop_ingress()
        self._ingress = stream
        self._ingress_member = member
        nursery.start_soon(self._watch_ingress, stream)

    async def _watch_ingress(self, stream: trio.abc.Stream) -> None:
        """Read the node's answers on ingress; notice when it closes or breaks."""
        decoder = FrameDecoder()
        try:
            while data := await stream.receive_some():
                for body in decoder.feed(data):
                    if self._ingress is stream:
                        self._on_egress(EGRESS.decode(body))
        except (*_NETWORK_ERRORS, ProtocolError):
            pass
        if self._ingress is stream:
            self._ingress = None
            self._ingress_member = -1
            self._wake.set()
            self._ac_wake.set()

    async def _send(self, message: Any) -> bool:
        stream = self._ingress
        if stream is None:
            return False
        try:
            await stream.send_all(encode_frame(message))
        except _NETWORK_ERRORS:
            if self._ingress is stream:
                await self._drop_ingress()
            return False
        self._last_send = trio.current_time()
        return True

    # ------------------------------------------------------------------ connect

    async def _connect(self, nursery: trio.Nursery) -> bool:
        """One AsyncConnect attempt; True once the session is open."""
        ac = AsyncConnect(
            self.endpoints,
            self.credentials,
            lambda: next(self._correlation_ids),
            self.response_channel,
        )
        self._ac = ac
        self._ac_actions = []
        queue: deque[Any] = deque(ac.on_egress_bound())
        with trio.move_on_after(self.connect_timeout):
            while True:
                if not queue:
                    self._ac_wake = trio.Event()
                    if not self._ac_actions:
                        if (
                            ac.state is ConnectState.POLL_RESPONSE
                            and self._ingress is None
                            and ac.member_id is not None
                        ):
                            queue.extend(ac.on_ingress_lost(ac.member_id))
                            continue
                        await self._ac_wake.wait()
                    queue.extend(self._ac_actions)
                    self._ac_actions.clear()
                    continue
                action = queue.popleft()
                if isinstance(action, ConnectIngress):
                    await self._drop_ingress()
                    members = list(action.members)
                    while True:
                        self.rng.shuffle(members)
                        for member in members:
                            stream = await self._dial(member)
                            if stream is not None:
                                break
                        else:
                            await trio.sleep(self.rng.uniform(0.05, 0.2))
                            continue
                        break
                    await self._use_ingress(nursery, member, stream)
                    queue.extend(ac.on_ingress_connected(member))
                elif isinstance(action, SendMessage):
                    if await self._send(action.message):
                        queue.extend(ac.on_sent())
                    else:
                        queue.extend(ac.on_ingress_lost(action.member_id))
                elif isinstance(action, Done):
                    result = action.result
                    ac.on_concluded()
                    self.session_id = result.cluster_session_id
                    self.outbox = Outbox()
                    self._resend_after = None
                    self.received_reply = 0
                    self.history.offered[self.session_id] = []
                    self.history.delivered[self.session_id] = []
                    self.session_secret = result.session_secret
                    self.term = result.leadership_term_id
                    self.leader_id = result.leader_member_id
                    self.endpoints = dict(result.endpoints)
                    self._session_lost = False
                    self._last_heard = trio.current_time()
                    self.sessions_opened += 1
                    self._ac = None
                    self.queries.ask_again_now(trio.current_time())  # lost with the last
                    self.trace("session-open", self.session_id, self.term, self.leader_id)
                    return True
                elif isinstance(action, Fail):
                    self.trace("connect-failed", str(action.error))
                    self._ac = None
                    await self._drop_ingress()
                    return False
        self.trace("connect-timeout", ac.state.name)
        self._ac = None
        await self._drop_ingress()
        return False

    # ------------------------------------------------------------------ work

    def _new_op(self) -> Op:
        n = next(self._op_numbers)
        request_id = self.index * 1_000_000 + n
        op = Op(
            request_id=request_id,
            client=self.index,
            key=f"{self.name}-{n}",
            value=f"v{request_id}-{self.rng.getrandbits(32):08x}".encode(),
            invoked_at=trio.current_time(),
        )
        self.history.ops[request_id] = op
        self.history.recent_keys.append(op.key)
        self.ops_started += 1
        return op

    def _header(self, payload: bytes, sequence: int) -> SessionMessageHeader:
        """A message of this session, saying how far its replies were received."""
        return SessionMessageHeader(
            self.term, self.session_id, 0, payload, sequence, self.received_reply
        )

    def _resume(self) -> SessionResumeRequest:
        return SessionResumeRequest(
            next(self._correlation_ids),
            self.session_id,
            PROTOCOL_VERSION,
            self.session_secret,
            self.received_reply,
        )

    async def _offer(self, op: Op) -> bool:
        """Offer ``op`` on this session, once: accepted, it is applied once and answered
        once whatever happens to the leaders (the outbox sends it again when a leader
        asks); whether this first send went out only says whether to go on sending."""
        payload = _encode(Put(op.request_id, op.key, op.value))
        sequence = self.outbox.add(payload)
        self.history.offered[self.session_id].append(payload)
        op.sends += 1
        op.sessions.append(self.session_id)
        op.offered_at = trio.current_time()
        return await self._send(self._header(payload, sequence))

    async def _ensure_own_ingress(self, nursery: trio.Nursery) -> None:
        """Egress on the ingress connection: resume at the leader, else at each other
        member in turn, until the leader takes the resume; SessionLost if none does."""
        deadline = trio.current_time() + 4 * self.leader_retry_time
        rotation = 0
        while trio.current_time() < deadline:
            if self._session_lost:
                raise SessionLost("closed by the cluster")
            # the leader sends at least every second: 3 s of silence means it is gone
            silent = trio.current_time() - self._last_heard > 3.0
            if (
                self._ingress is not None
                and self._confirmed
                and not self._redial_leader
                and not silent
            ):
                return
            if self._ingress is None or self._redial_leader or silent:
                if silent and self._ingress is not None:
                    self.trace("silent", self._ingress_member)
                    rotation += 1  # that member said nothing: the next one
                await self._drop_ingress()
                if self._redial_leader:
                    self._redial_leader = False
                    member = self.leader_id
                else:
                    order = [
                        self.leader_id,
                        *sorted(m for m in self.endpoints if m != self.leader_id),
                    ]
                    member = order[rotation % len(order)]
                stream = await self._dial(member)
                if stream is None:
                    self.trace("dial-failed", member)
                    rotation += 1
                    await trio.sleep(self.rng.uniform(0.05, 0.2))
                    continue
                await self._use_ingress(nursery, member, stream)
                self.trace("resume-at", member, self.received_reply)
                self._confirmed = False
                self._last_heard = trio.current_time()
                await self._send(self._resume())
            self._wake = trio.Event()
            with trio.move_on_after(0.25):
                await self._wake.wait()
        raise SessionLost("no member took the resume")

    async def _ensure_ingress(self, nursery: trio.Nursery) -> None:
        """Dial the leader until connected; SessionLost if it stays unreachable."""
        if self.own_egress:
            await self._ensure_own_ingress(nursery)
            return
        if self._ingress is not None and self._ingress_member == self.leader_id:
            return
        deadline = trio.current_time() + self.leader_retry_time
        while trio.current_time() < deadline:
            if self._session_lost:
                raise SessionLost("closed by the cluster")
            leader = self.leader_id
            stream = await self._dial(leader)
            if stream is not None:
                if leader == self.leader_id:
                    await self._use_ingress(nursery, leader, stream)
                    # the new connection proves it holds the session first
                    if await self._send(self._resume()):
                        return
                    continue
                await trio.aclose_forcefully(stream)
                continue
            await trio.sleep(self.rng.uniform(0.05, 0.2))
        raise SessionLost(f"leader {self.leader_id} unreachable")

    def _silent_since(self) -> float | None:
        """With a listening egress: since when a reply has been awaited with nothing at
        all heard (None: nothing awaited).  A member dials that egress and does not
        send it heartbeats, so only an awaited reply tells that it is gone."""
        if self.own_egress or self.egress_silence is None:
            return None
        awaited = [op.offered_at for op in self.outstanding.values()]
        awaited += [
            q.first_sent_at for q in self.queries.waiting.values() if q.sends and not q.on_links
        ]
        if not awaited:
            return None
        return max(self._last_heard, min(awaited))

    async def _work(self, nursery: trio.Nursery) -> None:
        next_op_at = trio.current_time()
        while not self.done:
            if self._session_lost:
                raise SessionLost("closed by the cluster")
            await self._ensure_ingress(nursery)
            if self._resend_after is not None:
                logged, self._resend_after = self._resend_after, None
                for sequence, payload in list(self.outbox.after(logged)):
                    if not await self._send(self._header(payload, sequence)):
                        break  # the next connection's resume asks again
            if self.snapshot_requested:
                request = AdminRequest(
                    self.term,
                    self.session_id,
                    next(self._correlation_ids),
                    AdminRequestType.SNAPSHOT,
                )
                if await self._send(request):
                    self.snapshot_requested = False
                    self.trace("snapshot-request", self.term)
            # what a lost session left unanswered is offered on this one (same request)
            for op in list(self.outstanding.values()):
                if op.sessions[-1] != self.session_id:
                    await self._offer(op)
            await self._send_queries()
            # new writes and queries (each kind in a window of its own: a client whose
            # writes wait for a leader goes on asking it)
            while (
                not self.stopping
                and self._room()
                and (self.max_ops is None or self.ops_started < self.max_ops)
                and trio.current_time() >= next_op_at
            ):
                sent = True
                if self.query_share and self.rng.random() < self.query_share:
                    if len(self.queries) < self.window:
                        self._new_query()
                        await self._send_queries()
                        sent = self._ingress is not None
                elif len(self.outstanding) < self.window:
                    op = self._new_op()
                    self.outstanding[op.request_id] = op
                    sent = await self._offer(op)
                next_op_at = trio.current_time() + self.rng.uniform(*self.think)
                if not sent:
                    break
            silent_since = self._silent_since()
            if silent_since is not None and self.egress_silence is not None:
                silent_until = silent_since + self.egress_silence
                if trio.current_time() >= silent_until:
                    # Nothing at all on egress: its connection may be gone for good
                    # (or its leader cut off from this client only), so start over.
                    raise SessionLost("no egress")
            if (
                self._ingress is not None
                and trio.current_time() >= self._last_send + self.keepalive_interval
            ):
                await self._send(SessionKeepAlive(self.term, self.session_id, self.outbox.sequence))
            if self.stopping and not self.outstanding and not self.queries:
                self._wake = trio.Event()
                with trio.move_on_after(self.keepalive_interval):
                    await self._wake.wait()
                continue
            # sleep until something happens or a timer is due
            wake_at = self._last_send + self.keepalive_interval
            if silent_since is not None and self.egress_silence is not None:
                wake_at = min(wake_at, silent_since + self.egress_silence)
            if not self.stopping and self._room():
                wake_at = min(wake_at, next_op_at)
            query_due = self.queries.next_due()
            if query_due is not None:
                wake_at = min(wake_at, query_due)
            if self._resend_after is not None:
                continue
            if self._ingress is None or self._ingress_member != self.leader_id:
                continue
            self._wake = trio.Event()
            with trio.move_on_at(wake_at):
                await self._wake.wait()
