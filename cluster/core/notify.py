"""What a session's client is told, and which way it reaches it.

:class:`SessionNotifier` is the one place the session manager, admission and resumption
send a client events about its session: a :class:`~cluster.protocol.egress.SessionEvent`
(OK, REDIRECT, ERROR, CLOSED) goes on the session's connection here while it has one
(every answer before OK does: a member dials nobody for a stranger), else on its dialled
egress; a :class:`~cluster.protocol.egress.NewLeaderEvent` says who leads (and is the
sign that the leader lives); a :class:`~cluster.protocol.egress.SessionAck` tells the
client what the log holds of its messages, and asks for the rest again; the replies the
service gave it go in order, from what the client lacks (:meth:`SessionNotifier.replies`,
exactly once out).  It keeps no state.
"""

from __future__ import annotations

from ..protocol import version as protocol_version
from ..protocol.egress import NewLeaderEvent, SessionAck, SessionEvent
from ..protocol.enums import EventCode
from .base import ConsensusConfig, Counters, EgressPort, TermView
from .replies import KeptReplies
from .session import ClusterSession, SessionProgress


class SessionNotifier:
    """Sends a session's client its events (see the module)."""

    def __init__(
        self, config: ConsensusConfig, egress: EgressPort, view: TermView, counters: Counters
    ) -> None:
        self.config = config
        self.egress = egress
        self.view = view
        self.counters = counters

    def event(
        self,
        session: ClusterSession,
        code: EventCode,
        detail: str,
        secret: bytes = b"",
        last_applied: int = 0,
    ) -> bool:
        """Tell the client of its session: on its connection here while it has one
        (answers before OK always do), else on its dialled egress.  ``last_applied``
        (CLOSED): the highest sequence of the session's messages the service applied."""
        view = self.view
        event = SessionEvent(
            cluster_session_id=session.cluster_session_id,
            correlation_id=session.correlation_id,
            leadership_term_id=view.leadership_term_id,
            leader_member_id=view.leader_member_id,
            code=code,
            version=protocol_version.PROTOCOL_VERSION,
            detail=detail,
            session_secret=secret,
            last_applied=last_applied,
        )
        source = session.source
        if source is not None and not source.closed:
            return self.egress.reply(source, event)
        return self.egress.send(session.egress_id, event)

    def new_leader(self, session: ClusterSession) -> bool:
        """Tell the session who leads (at a resume, a new leader, and every second as
        the sign that this leader lives)."""
        if not session.egress_connected:
            return False
        view = self.view
        if self.egress.send(
            session.egress_id,
            NewLeaderEvent(
                leadership_term_id=view.leadership_term_id,
                cluster_session_id=session.cluster_session_id,
                leader_member_id=view.leader_member_id,
                ingress_endpoints=self.config.ingress_endpoints,
            ),
        ):
            session.has_new_leader_event_pending = False
            return True
        return False

    def welcome(self, session: ClusterSession, progress: SessionProgress | None) -> bool:
        """A session reached this leader (a resume, or this member began to lead): who
        leads (:meth:`new_leader`), then what the log holds of its messages, asking for
        the rest again (:meth:`ack`): a hand-over costs the client a round trip; then
        the replies it has not confirmed (:meth:`replies`)."""
        if not self.new_leader(session):
            return False
        self.ack(session, 0 if progress is None else progress.applied_sequence, resend=True)
        session.resend_asked_ns = None  # a gap seen next is told at once
        if progress is not None:
            self.replies(session, progress.replies)
        return True

    def replies(self, session: ClusterSession, replies: KeptReplies) -> int:
        """Send the session's kept replies after the last sent, in order, while its
        egress takes them; returns how many went."""
        if not session.egress_connected:
            return 0
        send, egress_id, count = self.egress.send, session.egress_id, 0
        for reply in replies.unsent():
            if not send(egress_id, reply):
                break
            replies.sent = reply.reply
            count += 1
        return count

    def ack(self, session: ClusterSession, applied: int, *, resend: bool) -> bool:
        """Tell the client what the log holds of its messages: ``applied`` (the service
        applied them: it forgets them) and the highest in this leader's log; with
        ``resend``, ask for what follows that again at once."""
        if not session.egress_connected:
            return False
        return self.egress.send(
            session.egress_id,
            SessionAck(
                cluster_session_id=session.cluster_session_id,
                leadership_term_id=self.view.leadership_term_id,
                applied=applied,
                logged=session.last_sequence,
                resend=resend,
            ),
        )
