"""Whether this member may vote: a catch-up member (new or lost state) may not.

A member whose data directory is new (a first start, a replaced disk) or whose durable
state is behind what it once acknowledged cannot tell what it has promised: if it
voted, or counted toward a commit quorum, a candidate lacking acknowledged entries could
win (a wiped member of the quorum that acknowledged them, voting for a stale one).  So it
starts as a *catch-up* member: it votes for nobody, never nominates itself, and its
reports carry ``APPEND_POSITION_CATCHING_UP``, so a leader counts it toward no quorum.
It votes again (saved first, ``StoragePort.save_voting``) when either

* a leader elected by others has brought its log, verified and durable, to that leader's
  commit position, once that covers an entry of the leader's own term (then it covers
  everything ever committed: a new leader's commit position can lag what earlier leaders
  committed); entries committed meanwhile were committed by quorums of voters without it;
* or every configured member has canvassed with an empty log, this one's too: a
  brand-new cluster, where nothing was ever acknowledged
  (:meth:`cluster.core.election.Election._is_new_cluster`).

The shell decides where a member starts (:mod:`cluster.archive.identity`).
"""

from __future__ import annotations

import logging

from .base import StorageError, StoragePort
from .log import ReplicatedLog

log = logging.getLogger("cluster.consensus")


class VotingRights:
    """This member's standing: voting, or catching up."""

    __slots__ = ("catching_up", "member_id", "storage")

    def __init__(self, member_id: int, storage: StoragePort, *, catching_up: bool) -> None:
        self.member_id = member_id
        self.storage = storage
        self.catching_up = catching_up

    def promote(self, reason: str, position: int) -> bool:
        """Vote again, saved first; False if it could not be saved (it stays a catch-up
        member and tries again later)."""
        try:
            self.storage.save_voting()
        except StorageError:
            return False
        self.catching_up = False
        log.info(  # routine (every new member's): nothing for the operator to do
            "member %d is a voting member again (%s) at log position %d",
            self.member_id,
            reason,
            position,
        )
        return True

    def caught_up(self, rlog: ReplicatedLog, leader: int, term: int, leader_commit: int) -> bool:
        """Has the leader ``leader`` of ``term`` (elected by others: this member voted
        for nobody) brought this log to its commit position ``leader_commit``?  Then
        this member votes again (True once it does)."""
        commit = rlog.commit_position
        return (
            leader >= 0
            and commit >= leader_commit
            and rlog.terms.term_at(commit) == term
            and self.promote(f"caught up to leader {leader}'s commit position", commit)
        )
