"""Leases: a member with a live leader does not let another member depose it.

Raft moves a member to any later term it hears of, from anyone.  That lets a member
that merely lost touch (or a stranger: members are not authenticated on a plaintext
cluster, and a dead member's link is free to take) depose a leader that a quorum still
follows, and the cluster then takes no writes until an election, or a heartbeat
timeout, is over.  etcd-io/raft's answer is the check-quorum lease, and this is it,
made to hold for every message that could depose a leader, not only vote requests:

* **a leader in lease** (:meth:`Lease.leader_in_lease`: it has heard from a quorum
  within the heartbeat timeout) ignores vote requests (but a hand-over's) and canvasses
  of a later term, and a later term from any member it is not in touch with: one that
  has not reported to it within the election timeout and that its messages do not reach
  (:meth:`Lease.keeps_its_leader`);
* **a follower with a leader** ignores candidates (the sticky leader, in the consensus
  module), and, while it has heard its leader within the election timeout, a later term
  from any other member.

An honest member of a later term does not lose by it.  It was elected by a quorum that
voted for it, and a member only votes from an election, with no leader, or for a
hand-over its leader started, and a leader whose ballot that was has stepped down.  So
the followers that ignore it stop hearing their old leader and follow it an election
timeout later at most, while a leader hears of the later term from the followers it
has been hearing from, who are the ones that moved on.  A member stuck in a later term
(a candidate that lost a race with this leader's election) refuses the leader's appends
and answers with its term, as Raft has it; the leader's messages reach it, so the
leader steps down and it can rejoin.  A member that is down cannot be reached, whoever
dials in its name.  (One who also takes over a dead member's address can pass for it
in everything; only authenticating members, TLS, keeps it out.)  And ignoring a message
is never unsafe: it is a message lost, which Raft allows for.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..protocol.consensus import AppendPosition, AppendRequest, CommitPosition, SnapshotChunk
from ..protocol.enums import Role
from .base import ConsensusConfig, Counters, TermView
from .handover import Handover
from .tracker import ProgressTracker
from .validate import sender_of

log = logging.getLogger("cluster.consensus")

LaterTermMessage = AppendRequest | SnapshotChunk | CommitPosition | AppendPosition
LATER_TERM_MESSAGES = (AppendRequest, SnapshotChunk, CommitPosition, AppendPosition)
"""What moves a member to a later term, besides a vote request (which the election rules
guard): a leader's messages, and a follower's report of a term it has moved on to."""


class LeaseView(TermView, Protocol):
    """The consensus module as the lease reads it."""

    @property
    def role(self) -> Role: ...

    @property
    def last_leader_heard_ns(self) -> int:
        """When this follower last heard its leader."""


class Lease:
    """Whether this member has a live leader (itself, or the one it follows)."""

    __slots__ = ("_last_ignored", "config", "counters", "followers", "handover", "view")

    def __init__(
        self,
        config: ConsensusConfig,
        view: LeaseView,
        followers: ProgressTracker,
        handover: Handover,
        counters: Counters,
    ) -> None:
        self.config = config
        self.view = view
        self.followers = followers
        self.handover = handover
        self.counters = counters
        self._last_ignored = (-1, -1)
        """The member and term of the last later term ignored (logged once each)."""

    def leader_in_lease(self, now_ns: int) -> bool:
        """A ready leader that has heard from a quorum within the heartbeat timeout: a
        candidate of a later term can only be a member that lost touch with it, and is
        not let disrupt the cluster (etcd-io/raft's check-quorum lease)."""
        return self.view.is_ready_leader and self.followers.quorum_active(
            now_ns, self.config.leader_heartbeat_timeout_ns
        )

    def keeps_its_leader(self, message: LaterTermMessage, now_ns: int) -> bool:
        """Does this member ignore ``message``, of a later term than the one it follows
        or leads, to keep its live leader?  (Counted, and logged once per member and
        term: a forged or stray message.)"""
        view = self.view
        term = message.leadership_term_id
        if term <= view.leadership_term_id:
            return False
        sender = sender_of(message)
        lately = self.config.election_timeout_ns
        if view.role is Role.LEADER:
            ignore = (
                self.leader_in_lease(now_ns)
                and not self.handover.active
                and not self.followers.in_touch(sender, now_ns, lately)
            )
        else:
            ignore = (
                not view.in_election
                and 0 <= view.leader_member_id != sender
                and now_ns - view.last_leader_heard_ns < lately
            )
        if ignore:
            self.counters.later_terms_ignored += 1
            if (sender, term) != self._last_ignored:
                self._last_ignored = (sender, term)
                log.info(
                    "member %d ignores term %d of member %d (%s): it %s",
                    self.config.member_id,
                    term,
                    sender,
                    type(message).__name__,
                    "leads with a live quorum"
                    if view.role is Role.LEADER
                    else f"follows leader {view.leader_member_id}, who is alive",
                )
        return ignore
