"""Member links: the consensus channel between cluster members.

Each member *serves* its consensus port and *dials* every other member, like Aeron's
per-member publications: outbound connections only carry this member's messages to a
peer, inbound connections only bring a peer's messages here.  The first frame on an
outbound connection is a MemberHello naming the caller.

Nothing a peer sends is trusted: the hello must name this cluster's id (``--cluster-id``)
and another configured member with a compatible protocol version, and a second hello for
a member whose inbound link is open and live is refused, so it cannot take that link
over (a crashed member's connection is closed by its kernel; a silent one is closed, or
replaced by its member's new link, see below);
every later message is checked (:func:`cluster.core.validate.check_consensus_message`:
ranges, member ids, the sender named in it is the member the link said hello as) before
it reaches the consensus module.  A message that fails is a protocol error: logged,
counted, the link closed.  (Log bytes are checked by the follower's module once their
place in its log is known.)

A broken or refused link is redialled with back-off; messages sent while a link is down
are dropped (the consensus protocol resends what matters: heartbeats, and the leader's
replication restarts from what the follower reports).

Misconfiguration is loud.  The hello carries a digest of the caller's ``--members``
(:func:`cluster.config.members_digest`).  A hello refused for the caller's configuration
(another cluster id, an incompatible protocol version, a member list naming other member
ids) is answered with this member's own hello before the link closes: both ends log an
ERROR saying why (the caller reads its outbound link for that answer).  Lists that name
the same member ids at other addresses are logged on both ends at INFO
(:data:`ADDRESSES_DIFFER`), and the link goes on: that is a rolling ``--members`` change
of one member's address, which must not cost the quorum.  And
every ``unreachable_warning_interval`` (10 s) a member WARNs naming each peer its link to
is not up, with that link's last failure (connection refused, a TLS handshake's reason,
timed out, hello refused).

Silence is noticed (issue 44, :mod:`cluster.agents.silence`): both ends of a 2.1
member's link send their hello at least every ``keepalive_interval``; an end that hears
no byte for ``silence_timeout`` closes the link (redialled).  A new hello for a member
whose open link is stale (:func:`~cluster.agents.silence.stale`) replaces that link.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import suppress

import trio

from ..config import MemberEndpoints, members_difference
from ..core.validate import check_consensus_message
from ..protocol.admin import LinkStatus
from ..protocol.codec import CONSENSUS
from ..protocol.consensus import ConsensusMessage, MemberHello
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder, encode_frame
from ..protocol.version import LINK_KEEPALIVES, PROTOCOL_VERSION, is_compatible, to_string
from ..security import member_cert_error
from ..transport.base import Network
from ..transport.framed import FrameWriter, Receiver
from ..transport.gate import ConnectionGate, gated
from ..transport.tcp import failure_reason
from .silence import LinkSilence, serve_keepalives, stale

log = logging.getLogger("cluster.consensus.links")

DIAL_BACKOFF = 0.5
"""The longest wait between two dials that failed (from the start of one to the next): a
member back from a partition or a restart is linked within this of being reachable."""
QUICK_END = 1.0
HELLO_RECEIVE_SIZE = 4 * 1024
LINK_RECEIVE_SIZE = 256 * 1024
"""An inbound link reads this much at a time once its hello is taken (before: 4 KiB)."""
"""A link that ends within this many seconds of its hello was refused (or flaps): the
next dial backs off instead of coming straight back."""
REFUSAL_LINGER = 0.1
"""After answering a refused hello, how long to wait for the caller to read the answer
and close first (so that no reset can overtake the answer)."""
ADDRESSES_DIFFER = logging.INFO
"""How loud a peer's member list that differs from ours in addresses only is: that is
what a documented ``--members`` change (a member moved to a new address) looks like
while it rolls out, member by member, and the link goes on.  A list left stale is
still seen: a member that cannot reach another at the address it has gets the periodic
"cannot reach" WARNING.  Other member ids are an ERROR (the link is refused)."""

REPORT_AGAIN = 60.0
"""One misconfiguration (the same peer, the same cause) is logged again at most this
often (the periodic WARNING repeats it meanwhile)."""


class _Refused(ProtocolError):
    """A hello refused for the caller's configuration: the caller is told (this member's
    own hello) before the link closes.  ``level``: how loud this end logs it."""

    def __init__(self, message: str, level: int = logging.WARNING) -> None:
        super().__init__(message)
        self.level = level


def _why_broken(exc: BaseException) -> str:
    """A broken link's failure in a few words (a TLS alert's meaning, a socket's errno)."""
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        return failure_reason(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


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
        self.last_error = "not dialled yet"
        """Why the link is not up: how its last dial failed, or how its last link ended."""
        self.silences = 0
        """Links to this peer closed because it went silent."""
        self.silent_inbound = 0
        """Links from this peer closed because it went silent."""
        self.keepalives = False
        """Whether the peer said on its last link that it sends keepalives (2.1)."""

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
        members_digest: bytes = b"",
        unreachable_warning_interval: float = 10.0,
        keepalive_interval: float = 0.0,
        silence_timeout: float = 0.0,
    ) -> None:
        """``members_digest``: :func:`cluster.config.members_digest` of this member's
        ``--members``, sent in its hellos and compared with its peers' (empty: neither
        sent nor compared).  ``unreachable_warning_interval``: seconds between the
        WARNINGs naming the peers whose links are not up (0: none).
        ``keepalive_interval``: the most seconds a link of a 2.1 peer goes without a
        frame from this end; ``silence_timeout``: seconds without a byte after which
        such a link is closed (:func:`cluster.agents.silence.silence_bound`; either 0:
        neither)."""
        self.network = network
        self.me = me
        self.members_digest = members_digest
        self.unreachable_warning_interval = unreachable_warning_interval
        self.keepalive_interval = keepalive_interval if silence_timeout > 0 else 0.0
        self.silence_timeout = silence_timeout if keepalive_interval > 0 else 0.0
        self._members = [me, *peers]
        self._reported: dict[tuple[object, ...], float] = {}
        self.links = {p.member_id: PeerLink(p, max_backlog) for p in peers}
        self.member_ids = tuple(sorted([me.member_id, *self.links]))
        self.deliver = deliver
        self.delivered = delivered
        self.max_frame_size = max_frame_size
        self.cluster_id = cluster_id
        self.hello_timeout = hello_timeout
        unidentified = 2 * len(self.links) + 2  # more than members could: a stranger's flood
        self.gate = ConnectionGate("consensus port", unidentified, unidentified, evict_oldest=True)
        """Inbound links that have not said hello, counted at accept (before a TLS
        handshake); a link's slot is given back once its hello names a member.  No share
        per address: members may share a host.  When full, the oldest is closed for a new
        one: strangers holding every slot cannot keep a member's new link out."""
        self.protocol_errors = 0
        self.inbound: dict[int, int] = {}
        self.silent_inbound = 0
        """Inbound links closed because their member went silent."""
        #: the open inbound link of each member, the cancel scope of its reader, its ear
        self._live: dict[int, tuple[trio.abc.Stream, trio.CancelScope, LinkSilence | None]] = {}

    def statistics(self) -> list[LinkStatus]:
        return [
            LinkStatus(
                member_id=member_id,
                connected=link.is_connected,
                sent=link.sent_messages,
                dropped=link.dropped_messages,
                connects=link.connects,
                backlog=link.backlog,
                silences=link.silences,
                silent_inbound=link.silent_inbound,
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
                self.network.serve,
                self.me.host,
                self.me.consensus_port,
                gated(self._serve_peer, self.gate),
            )
            for link in self.links.values():
                nursery.start_soon(self._dial, link)
            if self.links and self.unreachable_warning_interval > 0:
                nursery.start_soon(self._warn_unreachable)
            task_status.started(port)

    def _ear(self) -> LinkSilence | None:
        """A new link's ear (armed once its peer is known to send keepalives)."""
        interval = self.keepalive_interval
        return LinkSilence(interval, self.silence_timeout, armed=False) if interval else None

    def _link_ear(self, link: PeerLink) -> LinkSilence | None:
        """An outbound link's ear: armed at once if the peer's last link said it sends
        keepalives (a dial that got through just before a partition is not left to the
        kernel), though none is sent to it until it says so again on this link."""
        ear = self._ear()
        if ear is not None:
            ear.armed = link.keepalives
        return ear

    def _hello_frame(self) -> bytes:
        return encode_frame(
            MemberHello(self.me.member_id, PROTOCOL_VERSION, self.cluster_id, self.members_digest)
        )

    def _report(self, level: int, key: tuple[object, ...], message: str, *args: object) -> None:
        """Log ``message`` at ``level``, but a repeat of ``key`` within
        :data:`REPORT_AGAIN` seconds only at DEBUG."""
        now = trio.current_time()
        last = self._reported.get(key)
        if last is not None and now - last < REPORT_AGAIN:
            log.debug(message, *args)
            return
        if len(self._reported) >= 256:  # bounded, whatever callers claim to be
            self._reported.clear()
        self._reported[key] = now
        log.log(level, message, *args)

    async def _warn_unreachable(self) -> None:
        """Every ``unreachable_warning_interval``: one WARNING naming each peer whose
        link is not up, and why (its last failure), and whether a quorum is left."""
        while True:
            await trio.sleep(self.unreachable_warning_interval)
            down = [link for _, link in sorted(self.links.items()) if not link.is_connected]
            if not down:
                continue
            members = len(self.member_ids)
            reachable = members - len(down)
            quorum = members // 2 + 1
            log.warning(
                "cannot reach %s; %d of %d members reachable (with this one), %s",
                ", ".join(
                    f"member {link.member.member_id} at {link.member.host}:"
                    f"{link.member.consensus_port} ({link.last_error})"
                    for link in down
                ),
                reachable,
                members,
                "a quorum" if reachable >= quorum else f"no quorum ({quorum} needed)",
            )

    async def _dial(self, link: PeerLink) -> None:
        member = link.member
        delay = 0.05
        while True:
            dialled = trio.current_time()
            try:
                stream = await self.network.open_stream(member.host, member.consensus_port)
            except OSError as exc:
                link.last_error = _why_broken(exc)
                # the back-off counts from the dial: one that timed out (a SYN dropped by
                # a partition) has waited already, and the next SYN goes out at once
                await trio.sleep_until(dialled + delay)
                delay = min(delay * 2, DIAL_BACKOFF)
                continue
            refusal = member_cert_error(stream, member.member_id)
            if refusal:  # not the member this address should be: try again later
                link.last_error = f"wrong member: {refusal}"
                self._report(
                    logging.WARNING,
                    ("certificate", member.member_id, refusal),
                    "member link to %d refused: %s",
                    member.member_id,
                    refusal,
                )
                await trio.aclose_forcefully(stream)
                await trio.sleep(1.0)
                continue
            started = trio.current_time()
            link.last_error, refused = await self._run_link(link, stream)
            if refused:  # a configuration that differs: no sooner than in a second
                delay = 1.0
            elif trio.current_time() - started < QUICK_END:
                delay = min(delay * 2, 1.0)
            else:
                delay = 0.05
            await trio.sleep(delay)

    async def _run_link(self, link: PeerLink, stream: trio.abc.Stream) -> tuple[str, bool]:
        """Say hello on ``stream``, then carry this member's messages to the peer (and
        read what the peer answers: nothing, unless it refuses the hello) until the link
        ends; return why it ended, and whether the peer refused the hello."""
        writer = FrameWriter(link.max_backlog, flushed_by_owner=True)
        writer.write_raw(self._hello_frame())
        link.writer = writer
        link.connects += 1
        link.connected.set()
        started = trio.current_time()
        wrote: tuple[str, bool] | None = None
        read: tuple[str, bool] | None = None
        silent: tuple[str, bool] | None = None
        ear = self._link_ear(link)
        try:
            async with trio.open_nursery() as nursery:

                async def write() -> None:
                    nonlocal wrote
                    try:
                        await writer.run(stream)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        log.debug("link to member %d broke: %s", link.member.member_id, exc)
                        wrote = (f"link broke: {_why_broken(exc)}", False)
                    nursery.cancel_scope.cancel()

                async def read_answers() -> None:
                    nonlocal read
                    read = await self._read_answers(link, stream, started, ear)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(write)
                nursery.start_soon(read_answers)
                if ear is not None:
                    hello = self._hello_frame()

                    async def listen() -> None:
                        nonlocal silent
                        quiet = await ear.watch(
                            stream,
                            keepalive=lambda: ear.spoke and writer.write_raw(hello),
                            sent=lambda: link.sent_messages,
                        )
                        link.silences += 1
                        link.keepalives = ear.spoke  # said nothing here: 2.0 again?
                        peer = link.member.member_id
                        log.warning("member link to %d silent for %.1f s: dial again", peer, quiet)
                        silent = (f"silent for {quiet:.1f} s", False)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(listen)
        finally:
            link.writer = None
            link.connected = trio.Event()
        if silent is not None:
            return silent
        if read is not None and (read[1] or wrote is None):
            return read
        return wrote or ("link closed", False)

    async def _read_answers(
        self,
        link: PeerLink,
        stream: trio.abc.Stream,
        started: float,
        ear: LinkSilence | None = None,
    ) -> tuple[str, bool]:
        """Read our outbound link until it ends: a peer sends nothing on it but its own
        hello: when it refuses ours or finds our member lists differ (logged here as an
        ERROR, like on the peer), and, from a 2.1 member, as a keepalive (``ear`` hears
        it, and is armed by it).  Returns why the link ended, and whether refused."""
        peer = link.member.member_id
        decoder = FrameDecoder(1 << 16)
        seen: MemberHello | None = None
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                data, why = b"", _why_broken(exc)
            else:
                why = f"closed by member {peer}"
            if ear is not None:
                ear.heard()
            if not data:
                if trio.current_time() - started < QUICK_END:
                    return f"{why} right after our hello (refused it? see its log)", False
                return why, False
            answers: list[ConsensusMessage] = []
            try:
                decoder.decode_into(data, CONSENSUS, answers)
            except ProtocolError as exc:
                return f"member {peer} sent bad bytes on our link: {exc}", False
            for answer in answers:
                if not isinstance(answer, MemberHello):
                    return f"member {peer} sent {type(answer).__name__} on our link", False
                if answer == seen:
                    continue  # a keepalive
                refusal = self._hello_answered(link, answer)
                if refusal:
                    return refusal, True
                seen = answer
                if ear is not None and answer.protocol_version >= LINK_KEEPALIVES:
                    ear.armed = ear.spoke = link.keepalives = True

    def _hello_answered(self, link: PeerLink, answer: MemberHello) -> str:
        """What a peer's answering hello says about our configuration and its: logged (an
        ERROR, or :data:`ADDRESSES_DIFFER`); returns why the link cannot go on ("" when
        it can: only addresses differ in the member lists)."""
        member = link.member
        peer = member.member_id
        where = f"{member.host}:{member.consensus_port}"
        if answer.cluster_id != self.cluster_id:
            self._report(
                logging.ERROR,
                ("cluster", peer, answer.cluster_id),
                "member link to member %d at %s refused: it is a member of cluster %d, this "
                "member of cluster %d (--cluster-id differs)",
                peer,
                where,
                answer.cluster_id,
                self.cluster_id,
            )
            return f"hello refused: it is of cluster {answer.cluster_id}, not {self.cluster_id}"
        if not is_compatible(answer.protocol_version):
            self._report(
                logging.ERROR,
                ("version", peer, answer.protocol_version),
                "member link to member %d at %s refused: it speaks protocol %s, this member %s",
                peer,
                where,
                to_string(answer.protocol_version),
                to_string(PROTOCOL_VERSION),
            )
            return f"hello refused: protocol {to_string(answer.protocol_version)}"
        if answer.member_id != peer:
            self._report(
                logging.ERROR,
                ("who", peer, answer.member_id),
                "member link to member %d at %s: the member there is member %d (--members "
                "differs between them?)",
                peer,
                where,
                answer.member_id,
            )
            return f"wrong member: member {answer.member_id} answers at {where}"
        difference = (
            members_difference(self._members, answer.members_digest)
            if self.members_digest
            else None
        )
        if difference is None:
            return ""  # it refused for a reason of its own: its log says which
        same_ids, words = difference
        self._report(
            ADDRESSES_DIFFER if same_ids else logging.ERROR,
            ("members", peer, answer.members_digest),
            "member %d's --members differs from ours: %s; %s",
            peer,
            words,
            "the link goes on (only addresses differ: a --members change rolling out?), but "
            "every member needs the same list once it is done"
            if same_ids
            else "it refuses the link (every member needs the same list)",
        )
        return "" if same_ids else f"hello refused: its --members differs ({words})"

    def close_inbound(self, member_id: int, reason: str) -> None:
        """The consensus module refused a message of ``member_id``: a protocol error on
        that member's link, which is closed (the member redials)."""
        live = self._live.get(member_id)
        self.protocol_errors += 1
        if live is not None:
            log.warning("closing member link from %d: %s", member_id, reason)
            live[1].cancel()

    def _hello(
        self,
        hello: MemberHello,
        stream: trio.abc.Stream,
        scope: trio.CancelScope,
        ear: LinkSilence | None = None,
    ) -> tuple[int, bool]:
        """Check a link's first frame; return the member it names, and whether to answer
        it with our own hello (its member list differs from ours only in addresses: both
        ends log it, the link goes on).  A hello refused for its sender's
        configuration raises :class:`_Refused` (answered, then closed); any other refusal
        :class:`ProtocolError` (closed)."""
        peer = hello.member_id
        if hello.cluster_id != self.cluster_id:
            raise _Refused(
                f"member link hello from member {peer} of cluster {hello.cluster_id}, "
                f"this is cluster {self.cluster_id} (--cluster-id differs)",
                logging.ERROR,
            )
        if not is_compatible(hello.protocol_version):
            raise _Refused(
                f"member {peer} speaks protocol {to_string(hello.protocol_version)}, "
                f"this member {to_string(PROTOCOL_VERSION)}"
            )
        refusal = member_cert_error(stream, peer)
        if refusal:
            raise ProtocolError(f"member link hello as member {peer}: {refusal}")
        difference = (
            members_difference(self._members, hello.members_digest) if self.members_digest else None
        )
        if difference is not None and not difference[0]:
            raise _Refused(
                f"member {peer}'s --members differs from ours: {difference[1]}; its link is "
                "refused (every member needs the same list)",
                logging.ERROR,
            )
        if peer not in self.links:
            raise _Refused(f"member link hello from unknown member {peer}")
        live = self._live.get(peer)
        if live is not None:
            quiet = stale(live[2], live[0])
            if quiet is None:
                raise ProtocolError(f"second link for member {peer}, whose link is open")
            log.info("member %d dialled again; its link heard nothing for %.1f s", peer, quiet)
            live[1].cancel()
        if difference is not None:
            self._report(
                ADDRESSES_DIFFER,
                ("members", peer, hello.members_digest),
                "member %d's --members differs from ours: %s; the link goes on (only "
                "addresses differ: a --members change rolling out?), but every member needs "
                "the same list once it is done",
                peer,
                difference[1],
            )
        self._live[peer] = (stream, scope, ear)
        if ear is not None and hello.protocol_version >= LINK_KEEPALIVES:
            ear.armed = True
        self.inbound[peer] = self.inbound.get(peer, 0) + 1
        return peer, difference is not None

    async def _answer(self, stream: trio.abc.Stream, *, refused: bool) -> None:
        """Send our hello back on an inbound link: its caller logs what differs.  When
        ``refused``, wait (briefly) for the caller to read it and close first."""
        with trio.move_on_after(REFUSAL_LINGER if refused else self.hello_timeout):
            try:
                await stream.send_all(self._hello_frame())
                while refused and await stream.receive_some(1 << 16):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _serve_peer(self, stream: trio.abc.Stream) -> None:
        # counted at accept by self.gate: more links saying nothing yet than members
        # could are closed there, before any handshake
        scope = trio.CancelScope()  # cancelled when the consensus module refuses the peer
        # a link must say who it is (MemberHello) within the handshake timeout
        scope.deadline = trio.current_time() + self.hello_timeout
        peer = [-1]
        try:
            with scope:
                async with trio.open_nursery() as nursery:  # the reader, keepalives, ear
                    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await self._read_peer(stream, scope, peer, nursery)
                    nursery.cancel_scope.cancel()
            if scope.cancelled_caught and peer[0] < 0:
                self.protocol_errors += 1
                log.info("closing a consensus connection that sent no MemberHello in time")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            if peer[0] >= 0 and self._live.get(peer[0], (None,))[0] is stream:
                del self._live[peer[0]]
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    async def _keep_inbound(
        self, stream: trio.abc.Stream, scope: trio.CancelScope, peer: int, ear: LinkSilence
    ) -> None:
        """An inbound link's keepalives (a 2.0 caller takes our hello for one that agrees)
        and its ear; the link (``scope``) is closed once silent, or once sending broke."""

        def silent(quiet: float) -> None:
            self.silent_inbound += 1
            self.links[peer].silent_inbound += 1
            log.warning("member link from %d silent for %.1f s: closed", peer, quiet)
            scope.cancel()

        await serve_keepalives(stream, ear, self._hello_frame(), silent)
        scope.cancel()

    async def _read_peer(
        self,
        stream: trio.abc.Stream,
        scope: trio.CancelScope,
        who: list[int],
        nursery: trio.Nursery,
    ) -> None:
        """Read, check and deliver one inbound link's messages until it ends or a
        message fails its checks; ``who[0]`` is the member its hello named.  Once the
        hello is taken, the link's keepalives and its ear run in ``nursery``."""
        decoder = FrameDecoder(self.max_frame_size)
        receiver = Receiver(stream, HELLO_RECEIVE_SIZE)  # a stranger's costs little
        peer = -1
        deliver = self.deliver
        delivered = self.delivered
        members, me = self.member_ids, self.me.member_id
        ear = self._ear()
        while True:
            data = await receiver.receive()
            if ear is not None:
                ear.heard()
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
                        peer, answer = self._hello(message, stream, scope, ear)
                        who[0] = peer
                        receiver.grow(LINK_RECEIVE_SIZE)
                        scope.deadline = math.inf
                        self.gate.release(stream)  # a member's link: no longer a stranger
                        if answer:
                            await self._answer(stream, refused=False)
                        if ear is not None:
                            nursery.start_soon(self._keep_inbound, stream, scope, peer, ear)
                        continue
                    if type(message) is MemberHello and message.member_id == peer:
                        continue  # a 2.1 member's keepalive
                    reason = check_consensus_message(message, members, me, peer)
                    if reason is not None:
                        raise ProtocolError(f"{type(message).__name__}: {reason}")
                    deliver(message)
                if bad is not None:
                    raise bad
            except _Refused as exc:
                self.protocol_errors += 1
                self._report(exc.level, ("refused", str(exc)), "closing member link: %s", exc)
                await self._answer(stream, refused=True)
                return
            except ProtocolError as exc:
                self.protocol_errors += 1
                log.warning("closing member link from %s: %s", peer, exc)
                if delivered is not None:
                    await delivered()  # messages decoded before the bad one still count
                return
            if delivered is not None:
                await delivered()
