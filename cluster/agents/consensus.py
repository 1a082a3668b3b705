"""Member links: the consensus channel between cluster members.

Each member *serves* its consensus port and *dials* every other member, like Aeron's
per-member publications: outbound connections only carry this member's messages to a
peer, inbound connections only bring a peer's messages here.  The first frame on an
outbound connection is a MemberHello naming the caller.

Nothing a peer sends is trusted: the hello must name this cluster's id (``--cluster-id``)
and another configured member with a compatible protocol version, and a second hello for
a member whose inbound link is open is refused, so it cannot take that link over, not
even while that member is paused (a crashed member's connection is closed by its kernel;
one whose host is gone is found dead by TCP keepalive, see ``cluster.transport.tcp``);
every later message is checked (:func:`cluster.core.validate.check_consensus_message`:
ranges, member ids, the sender named in it is the member the link said hello as) before
it reaches the consensus module.  A message that fails is a protocol error: logged,
counted, the link closed.  (Log bytes are checked by the follower's module once their
place in its log is known.)

A broken or refused link is redialled with back-off; messages sent while a link is down
are dropped (the consensus protocol resends what matters: heartbeats, and the leader's
replication restarts from what the follower reports).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import trio

from ..config import MemberEndpoints
from ..core.validate import check_consensus_message
from ..protocol.admin import LinkStatus
from ..protocol.codec import CONSENSUS
from ..protocol.consensus import ConsensusMessage, MemberHello
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder
from ..protocol.version import PROTOCOL_VERSION, is_compatible, to_string
from ..security import member_cert_error
from ..transport.base import Network
from ..transport.framed import FrameWriter

log = logging.getLogger("cluster.consensus.links")


class PeerLink:
    """The outbound link to one peer."""

    def __init__(self, member: MemberEndpoints, max_backlog: int) -> None:
        self.member = member
        self.max_backlog = max_backlog
        self.writer: FrameWriter | None = None
        self.connected = trio.Event()
        self.drained = trio.Event()
        self.sent_messages = 0
        self.dropped_messages = 0
        self.connects = 0

    @property
    def is_connected(self) -> bool:
        return self.writer is not None and not self.writer.closing

    @property
    def backlog(self) -> int:
        return self.writer.backlog if self.writer is not None else 0

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def send(self, message: ConsensusMessage) -> bool:
        """Queue ``message``; it goes out at the next :meth:`flush` (of this link or of
        :class:`PeerLinks`)."""
        writer = self.writer
        if writer is None or not writer.write_message(message):
            self.dropped_messages += 1
            return False
        self.sent_messages += 1
        return True


class PeerLinks:
    """Implements :class:`cluster.core.base.ConsensusPort` over a :class:`Network`."""

    def __init__(
        self,
        network: Network,
        me: MemberEndpoints,
        peers: list[MemberEndpoints],
        deliver: Callable[[ConsensusMessage], None],
        *,
        delivered: Callable[[], Awaitable[None]] | None = None,
        max_frame_size: int,
        max_backlog: int = 64 << 20,
        cluster_id: int = 0,
        hello_timeout: float = 5.0,
    ) -> None:
        self.network = network
        self.me = me
        self.links = {p.member_id: PeerLink(p, max_backlog) for p in peers}
        self.member_ids = tuple(sorted([me.member_id, *self.links]))
        self.deliver = deliver
        self.delivered = delivered
        self.max_frame_size = max_frame_size
        self.cluster_id = cluster_id
        self.hello_timeout = hello_timeout
        self._unidentified = 0  # inbound connections that have not said hello yet
        self.protocol_errors = 0
        self.inbound: dict[int, int] = {}
        #: the open inbound link of each member, and the cancel scope of its reader
        self._live: dict[int, tuple[trio.abc.Stream, trio.CancelScope]] = {}

    def statistics(self) -> list[LinkStatus]:
        return [
            LinkStatus(
                member_id=member_id,
                connected=link.is_connected,
                sent=link.sent_messages,
                dropped=link.dropped_messages,
                connects=link.connects,
                backlog=link.backlog,
            )
            for member_id, link in sorted(self.links.items())
        ]

    def send(self, member_id: int, message: ConsensusMessage) -> bool:
        link = self.links.get(member_id)
        return link.send(message) if link is not None else False

    def flush(self) -> None:
        """Send what is queued on every link now, from the caller's task."""
        for link in self.links.values():
            writer = link.writer
            if writer is not None and writer.backlog:
                writer.flush()

    async def wait_sent(self) -> None:
        """Wait until every link's queue has gone to its socket (callers bound the wait)."""
        while any(link.backlog for link in self.links.values()):  # noqa: ASYNC110
            await trio.sleep(0.005)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(
                self.network.serve, self.me.host, self.me.consensus_port, self._serve_peer
            )
            for link in self.links.values():
                nursery.start_soon(self._dial, link)
            task_status.started(port)

    async def _dial(self, link: PeerLink) -> None:
        delay = 0.05
        while True:
            try:
                stream = await self.network.open_stream(
                    link.member.host, link.member.consensus_port
                )
            except OSError:
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            refusal = member_cert_error(stream, link.member.member_id)
            if refusal:  # not the member this address should be: try again later
                log.warning("member link to %d refused: %s", link.member.member_id, refusal)
                await trio.aclose_forcefully(stream)
                await trio.sleep(1.0)
                continue
            delay = 0.05
            writer = FrameWriter(link.max_backlog, flushed_by_owner=True)
            writer.write_message(MemberHello(self.me.member_id, PROTOCOL_VERSION, self.cluster_id))
            link.writer = writer
            link.connects += 1
            link.connected.set()
            try:
                await writer.run(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("link to member %d broke: %s", link.member.member_id, exc)
            finally:
                link.writer = None
                link.connected = trio.Event()
            await trio.sleep(delay)

    def close_inbound(self, member_id: int, reason: str) -> None:
        """The consensus module refused a message of ``member_id``: a protocol error on
        that member's link, which is closed (the member redials)."""
        live = self._live.get(member_id)
        self.protocol_errors += 1
        if live is not None:
            log.warning("closing member link from %d: %s", member_id, reason)
            live[1].cancel()

    def _hello(self, hello: MemberHello, stream: trio.abc.Stream, scope: trio.CancelScope) -> int:
        """Check a link's first frame; return the member it names."""
        peer = hello.member_id
        if hello.cluster_id != self.cluster_id:
            raise ProtocolError(
                f"member link hello from member {peer} of cluster {hello.cluster_id}, "
                f"this is cluster {self.cluster_id}"
            )
        if peer not in self.links:
            raise ProtocolError(f"member link hello from unknown member {peer}")
        if not is_compatible(hello.protocol_version):
            raise ProtocolError(
                f"member {peer} speaks protocol {to_string(hello.protocol_version)}, "
                f"this member {to_string(PROTOCOL_VERSION)}"
            )
        refusal = member_cert_error(stream, peer)
        if refusal:
            raise ProtocolError(f"member link hello as member {peer}: {refusal}")
        if peer in self._live:
            raise ProtocolError(f"second link for member {peer}, whose link is open")
        self._live[peer] = (stream, scope)
        self.inbound[peer] = self.inbound.get(peer, 0) + 1
        return peer

    async def _serve_peer(self, stream: trio.abc.Stream) -> None:
        if self._unidentified >= 2 * len(self.links) + 2:
            # more links saying nothing yet than members could: a stranger's flood
            self.protocol_errors += 1
            await trio.aclose_forcefully(stream)
            return
        scope = trio.CancelScope()  # cancelled when the consensus module refuses the peer
        # a link must say who it is (MemberHello) within the handshake timeout
        scope.deadline = trio.current_time() + self.hello_timeout
        self._unidentified += 1
        peer = [-1]
        try:
            with scope:
                await self._read_peer(stream, scope, peer)
            if scope.cancelled_caught and peer[0] < 0:
                self.protocol_errors += 1
                log.info("closing a consensus connection that sent no MemberHello in time")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            if peer[0] < 0:
                self._unidentified -= 1
            if peer[0] >= 0 and self._live.get(peer[0], (None,))[0] is stream:
                del self._live[peer[0]]
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _read_peer(
        self, stream: trio.abc.Stream, scope: trio.CancelScope, who: list[int]
    ) -> None:
        """Read, check and deliver one inbound link's messages until it ends or a
        message fails its checks; ``who[0]`` is the member its hello named."""
        decoder = FrameDecoder(self.max_frame_size)
        peer = -1
        deliver = self.deliver
        delivered = self.delivered
        members, me = self.member_ids, self.me.member_id
        while True:
            data = await stream.receive_some(256 * 1024)
            if not data:
                return
            messages: list[ConsensusMessage] = []
            bad: ProtocolError | None = None
            try:
                decoder.decode_into(data, CONSENSUS, messages)
            except ProtocolError as exc:
                bad = exc  # the messages before the bad frame still count
            try:
                for message in messages:
                    if peer < 0:
                        if not isinstance(message, MemberHello):
                            raise ProtocolError("member link did not start with MemberHello")
                        peer = who[0] = self._hello(message, stream, scope)
                        scope.deadline = math.inf
                        self._unidentified -= 1
                        continue
                    reason = check_consensus_message(message, members, me, peer)
                    if reason is not None:
                        raise ProtocolError(f"{type(message).__name__}: {reason}")
                    deliver(message)
                if bad is not None:
                    raise bad
            except ProtocolError as exc:
                self.protocol_errors += 1
                log.warning("closing member link from %s: %s", peer, exc)
                if delivered is not None:
                    await delivered()  # messages decoded before the bad one still count
                return
            if delivered is not None:
                await delivered()
