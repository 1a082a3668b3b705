"""Leader election (Aeron's ``Election``), sans-IO.

A member enters an election at start-up, when its leader goes quiet (leader heartbeat
timeout), when it is a leader without an active quorum of followers, or when it sees a
higher term.  The states and messages are Aeron's:

* **CANVASS**: publish CanvassPosition (this member's log: last term and position) every
  status interval; collect the others'.  Nominate once this member is a *unanimous*
  candidate (everyone answered, nobody has a better log) or, after the canvass deadline,
  a *quorum* candidate (a quorum answered, none of them better).  Because members only
  canvass while they are in an election themselves, a member cut off from a healthy
  cluster cannot win votes and does not disrupt it (a pre-vote, in Raft's terms).

  At start-up the deadline is the start-up canvass timeout (500 ms by default); in any
  later election it has passed already.  Waiting for every member is a preference, not
  what keeps elections safe: members started together all answer within it, and the
  member with the best log of all (its uncommitted tail too) is the one that stands.
  Safety comes from the vote rule: an entry committed was on a quorum, any quorum of
  voters holds one member of it, and that member votes only for a log at least as up
  to date as its own, so a candidate without the entry cannot win.  That holds only for
  voters whose durable state is intact, which is why a member whose state is new or
  lost votes for nobody (:mod:`cluster.core.voting`).  So a cluster restarted with a
  member missing elects among the others once the deadline passes, and the missing
  member joins as a follower when it comes.  (Aeron waits 60 s by default; with a
  member down that was a minute of no leader for no gain.)
* **NOMINATE**: wait a random delay in ``[0, election_timeout / 2)``, then propose term
  ``max(candidate term, terms seen) + 1`` (persisted before it is used), vote for itself;
  the terms seen are the candidate terms other members canvassed with.
* **CANDIDATE_BALLOT**: send RequestVote; win as soon as a quorum has voted yes (Aeron
  waits for every vote or the ballot deadline; a majority is enough for safety and makes
  failover faster); otherwise back to CANVASS at the deadline.
* **FOLLOWER_BALLOT**: after granting a vote; back to CANVASS if no leader shows up.

Winning sets :attr:`Election.won_term`, which the consensus module acts on (the election
never calls out); a leader's AppendRequest of a term at least as high as ours ends the
election as a follower (in the consensus module).  A vote is granted only to a higher
term than any this member has voted in or seen, and only if the candidate's log is at
least as up to date as ours, compared by ``(last log term, log position)``.
"""

from __future__ import annotations

import enum
import logging
import random
from typing import Protocol

from ..protocol.consensus import (
    CANVASS_CATCHING_UP,
    VOTE_TRANSFER,
    CanvassPosition,
    RequestVote,
    Vote,
)
from ..protocol.version import PROTOCOL_VERSION
from . import quorum
from .base import ConsensusConfig, ConsensusPort
from .log import ReplicatedLog
from .voting import VotingRights

log = logging.getLogger("cluster.consensus")


WAITING_LOG_INTERVAL_NS = 10_000_000_000
"""How often a catch-up member without a leader says why it does not vote."""


class ElectionState(enum.IntEnum):
    """Aeron's election states (same codes); Triarch uses the subset its design needs."""

    INIT = 0
    CANVASS = 1
    NOMINATE = 2
    CANDIDATE_BALLOT = 3
    FOLLOWER_BALLOT = 4
    LEADER_LOG_REPLICATION = 5
    LEADER_REPLAY = 6
    LEADER_INIT = 7
    LEADER_READY = 8
    FOLLOWER_LOG_REPLICATION = 9
    FOLLOWER_REPLAY = 10
    FOLLOWER_CATCHUP_INIT = 11
    FOLLOWER_CATCHUP_AWAIT = 12
    FOLLOWER_CATCHUP = 13
    FOLLOWER_LOG_INIT = 14
    FOLLOWER_LOG_AWAIT = 15
    FOLLOWER_READY = 16
    CLOSED = 17


def log_is_newer(a_term: int, a_position: int, b_term: int, b_position: int) -> bool:
    """Is log ``a`` strictly more up to date than log ``b``?"""
    return (a_term, a_position) > (b_term, b_position)


def answer_vote(
    consensus: ConsensusPort, me: int, rlog: ReplicatedLog, msg: RequestVote, granted: bool
) -> None:
    """Answer a candidate's RequestVote, with this member's (durable) log."""
    position = rlog.archive_position
    consensus.send(
        msg.candidate_member_id,
        Vote(
            candidate_term_id=msg.candidate_term_id,
            log_leadership_term_id=rlog.terms.term_at(position),
            log_position=position,
            candidate_member_id=msg.candidate_member_id,
            follower_member_id=me,
            vote=granted,
        ),
    )


class Terms(Protocol):
    """The member's terms as an election reads and raises them."""

    @property
    def candidate_term_id(self) -> int: ...

    @property
    def leadership_term_id(self) -> int: ...

    def set_candidate_term(self, term: int) -> bool:
        """Persist ``term`` as the highest seen or voted in, if it is higher; False if
        it could not be saved (a full disk): then it must not be acted upon."""


class Election:
    """One election, from CANVASS until this member leads or follows."""

    def __init__(
        self,
        config: ConsensusConfig,
        log: ReplicatedLog,
        terms: Terms,
        voting: VotingRights,
        consensus: ConsensusPort,
        rng: random.Random,
        now_ns: int,
        *,
        is_startup: bool,
        reason: str,
        transfer: bool = False,
    ) -> None:
        self.config = config
        self.log = log
        self.terms = terms
        self.voting = voting
        self.consensus = consensus
        self.rng = rng
        self.reason = reason
        self.is_startup = is_startup
        self.state = ElectionState.CANVASS
        self.canvass: dict[int, tuple[int, int, int, int]] = {}
        """member -> (log term, log position, candidate term, flags) of its last canvass."""
        self.votes: dict[int, bool] = {}
        self.won_term: int | None = None
        """Set once this member has won: the term it leads (the consensus module then
        makes it leader)."""
        self.canvass_deadline_ns = now_ns + (config.startup_canvass_timeout_ns if is_startup else 0)
        self.next_status_ns = now_ns
        self.nominate_at_ns = 0
        self.ballot_deadline_ns = 0
        self._next_waiting_log_ns = 0
        self.transfer = transfer
        """Its leader handed leadership to this member (TimeoutNow): it nominates at once,
        and its RequestVote says so (``VOTE_TRANSFER``)."""
        if transfer:
            self.state = ElectionState.NOMINATE
            self.nominate_at_ns = now_ns

    # ------------------------------------------------------------------ helpers

    def _my_log(self) -> tuple[int, int]:
        """This member's log as elections compare it: what is durable here.  Entries not
        yet durable were acknowledged nowhere by this member, so a vote compared on the
        durable log keeps every committed entry; and a member whose disk has stopped
        taking writes does not hold up the others with a log it cannot keep."""
        position = self.log.archive_position
        return self.log.terms.term_at(position), position

    def _is_candidate(self, need_all: bool) -> bool:
        """Nominate: a quorum of voters (``need_all``: and every other member) has
        canvassed, and none of them has a better log.  Catch-up members count toward
        no quorum (nor does their log: they are not in any quorum that committed it)."""
        others = self.config.others
        canvass = self.canvass
        reported = [m for m in others if m in canvass]
        if need_all and len(reported) < len(others):
            return False
        voters = [m for m in reported if not canvass[m][3] & CANVASS_CATCHING_UP]
        if not quorum.has_quorum(len(voters) + 1, self.config.member_count):
            return False
        my_term, my_pos = self._my_log()
        return not any(log_is_newer(canvass[m][0], canvass[m][1], my_term, my_pos) for m in voters)

    def _is_new_cluster(self) -> bool:
        """Every configured member has canvassed with an empty log, this one's too: the
        cluster is brand new, nothing was ever acknowledged, and a new member may vote
        (and a cluster of one, whose own log, whatever is left of it, is all there is).
        (Two empty members of three are not enough: the third may hold what a quorum
        that included their lost disks acknowledged.)"""
        if self.config.member_count == 1:
            return True  # its own log is all there is: nobody else holds anything
        if self.log.published_position != 0 or len(self.log.terms):
            return False
        canvass = self.canvass
        return all(
            m in canvass and canvass[m][1] == 0 and canvass[m][0] == -1 for m in self.config.others
        )

    def _to_canvass(self, now_ns: int) -> None:
        self.state = ElectionState.CANVASS
        self.canvass.clear()
        self.votes.clear()
        self.next_status_ns = now_ns

    def _say_why_waiting(self, now_ns: int) -> None:
        """A catch-up member with no leader WARNs every 10 s why it does not vote."""
        if now_ns < self._next_waiting_log_ns:
            return
        first = self._next_waiting_log_ns == 0
        self._next_waiting_log_ns = now_ns + WAITING_LOG_INTERVAL_NS
        if first:
            return  # the first canvass round has only just gone out
        canvass = self.canvass
        silent = [m for m in self.config.others if m not in canvass]
        holding = [m for m in self.config.others if m in canvass and canvass[m][1] > 0]
        detail = []
        if silent:
            detail.append(f"no answer from member(s) {', '.join(map(str, silent))}")
        if holding:
            detail.append(f"member(s) {', '.join(map(str, holding))} hold a log")
        log.warning(
            "member %d is a catch-up member (its data directory is new or lost its state) "
            "and no leader has caught it up: it votes once a leader elected by the others "
            "does, or, for a brand-new cluster, once every member answers with an empty "
            "log (%s)",
            self.config.member_id,
            "; ".join(detail) or "every member answered",
        )

    def _count_votes(self) -> None:
        if quorum.has_quorum(sum(self.votes.values()), self.config.member_count):
            self.won_term = self.terms.candidate_term_id  # Raft: a majority suffices

    # ------------------------------------------------------------------ work

    def do_work(self, now_ns: int) -> int:
        state = self.state
        cfg = self.config
        if state in (ElectionState.CANVASS, ElectionState.NOMINATE):
            if now_ns >= self.next_status_ns:
                self._publish_canvass()
                self.next_status_ns = now_ns + cfg.election_status_interval_ns
            if state is ElectionState.CANVASS:
                voting = self.voting
                if voting.catching_up and not (
                    self._is_new_cluster()
                    and voting.promote(
                        "a cluster of one"
                        if cfg.member_count == 1
                        else "every member canvassed with an empty log",
                        self.log.published_position,
                    )
                ):
                    self._say_why_waiting(now_ns)
                    return 0  # waits for a leader elected by others to catch it up
                if self.log.archive_position < self.log.published_position:
                    return 0  # nominates only once its log is durable (a stuck disk never)
                if (
                    cfg.member_count == 1
                    or self._is_candidate(need_all=True)
                    or (now_ns >= self.canvass_deadline_ns and self._is_candidate(need_all=False))
                ):
                    self.state = ElectionState.NOMINATE
                    delay = int(self.rng.random() * cfg.election_timeout_ns / 2)
                    self.nominate_at_ns = now_ns + (0 if cfg.member_count == 1 else delay)
                    return 1
            elif now_ns >= self.nominate_at_ns:
                self._nominate(now_ns)
                return 1
        elif state is ElectionState.CANDIDATE_BALLOT:
            if now_ns >= self.ballot_deadline_ns:
                self._count_votes()
                if self.won_term is None:
                    self._to_canvass(now_ns)
                return 1
        elif state is ElectionState.FOLLOWER_BALLOT and now_ns >= self.ballot_deadline_ns:
            self._to_canvass(now_ns)
            return 1
        return 0

    def _publish_canvass(self) -> None:
        log_term, position = self._my_log()
        # The term field carries the highest term this member has voted in or seen (its
        # candidate term), not only the one it last followed: a candidate then proposes a
        # term every member will consider.  A refused Vote does not say why, so without
        # it a member whose candidate term had moved ahead (a forged or lost message)
        # would refuse every candidate below it, ballot after ballot.
        message = CanvassPosition(
            log_leadership_term_id=log_term,
            log_position=position,
            leadership_term_id=self.terms.candidate_term_id,
            follower_member_id=self.config.member_id,
            protocol_version=PROTOCOL_VERSION,
            flags=CANVASS_CATCHING_UP if self.voting.catching_up else 0,
        )
        for member in self.config.others:
            self.consensus.send(member, message)

    def _nominate(self, now_ns: int) -> None:
        terms = self.terms
        seen = max((c[2] for c in self.canvass.values()), default=-1)
        term = max(terms.candidate_term_id, seen, terms.leadership_term_id) + 1
        if not terms.set_candidate_term(term):
            self._to_canvass(now_ns)  # no campaign on a term not saved: try again later
            return
        self.state = ElectionState.CANDIDATE_BALLOT
        self.votes = {self.config.member_id: True}
        self.ballot_deadline_ns = now_ns + self.config.election_timeout_ns
        log_term, position = self._my_log()
        request = RequestVote(
            log_leadership_term_id=log_term,
            log_position=position,
            candidate_term_id=term,
            candidate_member_id=self.config.member_id,
            protocol_version=PROTOCOL_VERSION,
            flags=VOTE_TRANSFER if self.transfer else 0,
        )
        self.transfer = False  # a ballot that fails goes back to a normal canvass
        for member in self.config.others:
            self.consensus.send(member, request)
        if len(self.votes) == self.config.member_count:
            self.won_term = term  # a cluster of one

    # ------------------------------------------------------------------ messages

    def on_canvass_position(self, msg: CanvassPosition, now_ns: int) -> None:
        self.canvass[msg.follower_member_id] = (
            msg.log_leadership_term_id,
            msg.log_position,
            msg.leadership_term_id,
            msg.flags,
        )

    def on_request_vote(self, msg: RequestVote, now_ns: int) -> None:
        terms = self.terms
        granted = False
        if self.voting.catching_up:
            pass  # votes for nobody until caught up
        elif msg.candidate_term_id > terms.candidate_term_id and terms.set_candidate_term(
            msg.candidate_term_id
        ):  # a vote only once its term is saved
            my_term, my_pos = self._my_log()
            if not log_is_newer(my_term, my_pos, msg.log_leadership_term_id, msg.log_position):
                granted = True
                self.state = ElectionState.FOLLOWER_BALLOT
                self.ballot_deadline_ns = now_ns + self.config.election_timeout_ns
            elif self.state is ElectionState.CANDIDATE_BALLOT:
                self._to_canvass(now_ns)  # our ballot's term is now stale
        answer_vote(self.consensus, self.config.member_id, self.log, msg, granted)

    def on_vote(self, msg: Vote, now_ns: int) -> None:
        if (
            self.state is not ElectionState.CANDIDATE_BALLOT
            or msg.candidate_term_id != self.terms.candidate_term_id
            or msg.candidate_member_id != self.config.member_id
        ):
            return
        self.votes[msg.follower_member_id] = msg.vote
        self._count_votes()
