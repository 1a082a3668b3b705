"""Exactly once in (issue 42): what a ready leader does with a session message that is
not its session's next.

The leader appends only a session's next sequence (``ClusterSession.last_sequence`` + 1:
the one compare of the hot path, in :meth:`~cluster.core.consensus.ConsensusModule.on_batch`);
:class:`SessionSequencing` handles the rest.  A duplicate (the log holds it: the client
sent it again after a resume or a gap) is dropped and counted; after a gap (a message
before it was lost on the way: dropped by a leader handing over, a broken connection) the
client is asked to resend what follows the log's last
(:class:`~cluster.protocol.egress.SessionAck` with ``resend``), once per
:data:`~cluster.core.session.RESEND_AGAIN_NS`.  It reads what the service applied of each
session through ``progress`` (the service container sets it), which is what a new
leader's log holds when it becomes ready.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.ingress import SessionMessageHeader
from .base import Counters
from .notify import SessionNotifier
from .session import RESEND_AGAIN_NS, ClusterSession, SessionProgress


class SessionSequencing:
    """Duplicates and gaps of a session's sequenced messages (see the module)."""

    def __init__(self, notify: SessionNotifier, counters: Counters) -> None:
        self.notify = notify
        self.counters = counters
        self.progress: Callable[[int], SessionProgress | None] = lambda session_id: None
        """What the service's side knows of a session's sequenced messages (the service
        container sets it: :meth:`ServiceContainer.progress
        <cluster.core.service_container.ServiceContainer.progress>`)."""

    def applied(self, cluster_session_id: int) -> int:
        """The highest sequence of the session's messages that the service applied."""
        progress = self.progress(cluster_session_id)
        return 0 if progress is None else progress.applied_sequence

    def out_of_sequence(
        self, session: ClusterSession, header: SessionMessageHeader, now_ns: int
    ) -> None:
        """A ready leader dropped a session message that is not the session's next: a
        duplicate is only counted; after a gap the client is asked to resend."""
        if header.sequence <= session.last_sequence:
            self.counters.duplicate_messages += 1
            return
        self.counters.sequence_gaps += 1
        self.ask_resend(session, now_ns)

    def ask_resend(self, session: ClusterSession, now_ns: int) -> None:
        """Ask the client for what follows the log's last (unless asked just now)."""
        asked = session.resend_asked_ns
        if asked is not None and now_ns - asked < RESEND_AGAIN_NS:
            return
        if self.notify.ack(session, self.applied(session.cluster_session_id), resend=True):
            session.resend_asked_ns = now_ns

    def restart_replies(self, session: ClusterSession, received: int = 0) -> None:
        """The session's client has a new connection, or lost one: the replies it has
        not confirmed (after ``received``, if it said) go again, in order, before any
        given from now on (:meth:`~cluster.core.replies.KeptReplies.restart`)."""
        progress = self.progress(session.cluster_session_id)
        if progress is not None:
            progress.replies.restart(received)

    def send_replies(self, session: ClusterSession) -> int:
        """Send the session's replies still to go, in order, while its egress takes
        them (none once the service applied its close); returns how many went."""
        progress = self.progress(session.cluster_session_id)
        return 0 if progress is None else self.notify.replies(session, progress.replies)
