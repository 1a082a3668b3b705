"""A peer's bytes are never trusted: the checks of member messages and the consensus
module's own defences, with hypothesis fuzzing the follower's append path and the
leader's handling of follower reports (issue: consensus hardening)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from core_harness import MS, SECOND, Cluster, MemoryShell, NullEgress, Storage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.archive.errors import ArchiveCorruptionError
from cluster.archive.node_state import NodeState
from cluster.archive.record import RECORD_HEADER_LENGTH, append_record, iter_records
from cluster.core.base import ConsensusConfig, MemberRefused
from cluster.core.consensus import ConsensusModule
from cluster.core.validate import MAX_TERM_STEP, check_consensus_message, check_records
from cluster.protocol.consensus import (
    APPEND_POSITION_VERIFIED,
    MAX_POSITION,
    MAX_TERM,
    AppendPosition,
    AppendRequest,
    CanvassPosition,
    CommitPosition,
    MemberHello,
    RequestVote,
    SnapshotChunk,
    Vote,
)
from cluster.protocol.enums import Role

MEMBERS = (0, 1, 2)
HEADER = RECORD_HEADER_LENGTH


def records(*bodies: bytes) -> bytes:
    buf = bytearray()
    for body in bodies:
        append_record(buf, body)
    return bytes(buf)


def append(term: int = 1, at: int = 0, data: bytes = b"", **fields: int) -> AppendRequest:
    values = {
        "leadership_term_id": term,
        "leader_member_id": 1,
        "log_position": at,
        "prev_term_id": -1 if at == 0 else term,
        "data_term_id": term,
        "term_base_log_position": 0,
        "commit_position": 0,
        **fields,
    }
    return AppendRequest(data=data, **values)


# ---------------------------------------------------------------------- the checks


def test_records_must_be_whole_and_pass_their_crc() -> None:
    good = records(b"one", b"two")
    assert check_records(good) is None
    assert "incomplete record header" in str(check_records(good + b"\x01\x02"))
    assert "incomplete record at" in str(check_records(good[:-1]))
    flipped = bytearray(good)
    flipped[-1] ^= 0x40
    assert "CRC" in str(check_records(bytes(flipped)))
    assert "longer than" in str(check_records(b"\xff\xff\xff\xff" + bytes(12)))
    assert "empty record" in str(check_records(bytes(16)))  # length 0, CRC 0: "valid"
    # the first attack: 16 garbage bytes as an AppendRequest's data
    assert check_records(bytes(range(16))) is not None


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (append(data=bytes(16)), None),  # the data is the follower's to check (below)
        (append(term=MAX_TERM + 1), "term out of range"),
        (append(at=-1), "position out of range"),
        (append(at=MAX_POSITION), None),
        (append(at=MAX_POSITION, data=records(b"x")), "position out of range"),
        (append(commit_position=MAX_POSITION + 1), "position out of range"),
        (append(leader_member_id=7), "leader member 7 is not the sender"),
        (append(leader_member_id=0), "leader member 0 is not the sender"),  # this member's own id
        (append(term=1, data_term_id=2), "after the leader's"),
        (append(at=10, data=records(b"x"), term_base_log_position=20), "inconsistent"),
        (AppendPosition(1, 2**40, 2, APPEND_POSITION_VERIFIED), None),
        (AppendPosition(2**63 - 1, 0, 2, 0), "out of range"),
        (AppendPosition(1, 0, 9, 0), "follower member is not the sender"),
        (CommitPosition(2**63 - 1, 0, 1), "out of range"),
        (CommitPosition(1, -5, 1), "out of range"),
        (CanvassPosition(0, 0, MAX_TERM + 1, 1, 0), "term out of range"),
        (RequestVote(0, 0, 2**62 + 1, 1, 0), "term out of range"),
        (RequestVote(5, 0, 4, 1, 0), "log term after the candidate term"),
        (RequestVote(0, 0, 4, 3, 0), "candidate is not the sender"),
        (Vote(4, 0, 0, 1, 2, True), "a vote for another member"),
        (Vote(4, 0, 0, 0, 2, True), None),
        (MemberHello(1, 0), "unexpected MemberHello"),
    ],
)
def test_member_messages_are_checked(message: object, reason: str | None) -> None:
    """(Without a sender: as any configured member may send it.)"""
    found = check_consensus_message(message, MEMBERS, 0)  # type: ignore[arg-type]
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert reason in found


def test_a_message_names_the_member_whose_link_brought_it() -> None:
    # the second attack: an AppendRequest in the leader's name from another member's link
    forged = append(data=records(b"put k v"))  # leader_member_id=1
    assert check_consensus_message(forged, MEMBERS, 0, sender=1) is None
    assert "not the sender" in str(check_consensus_message(forged, MEMBERS, 0, sender=2))
    report = AppendPosition(1, 10, 1, APPEND_POSITION_VERIFIED)
    assert "not the sender" in str(check_consensus_message(report, MEMBERS, 0, sender=2))
    vote = RequestVote(0, 0, 4, 1, 0)
    assert "not the sender" in str(check_consensus_message(vote, MEMBERS, 0, sender=2))


# ---------------------------------------------------------------------- the core


def follower() -> tuple[ConsensusModule, bytearray, dict[int, int]]:
    cm = ConsensusModule(
        ConsensusConfig(member_id=0, member_ids=MEMBERS),
        NullEgress(),
        storage=Storage(),
        rng=random.Random(0),
    )
    return cm, bytearray(), {0: 0}


def test_garbage_log_bytes_from_the_leader_are_refused_not_appended() -> None:
    # the first attack: 16 garbage bytes as the leader's append, at the append position
    cm, _disk, _applied = follower()
    cm.on_consensus_message(append(data=bytes(range(16)), commit_position=16), SECOND)
    assert cm.log.published_position == 0
    assert cm.commit_position == 0
    assert cm.counters.invalid_messages == 1
    (refused,) = [e for e in cm.take_events() if isinstance(e, MemberRefused)]
    assert refused.member_id == 1  # the shell closes member 1's link
    assert "fails its CRC" in refused.reason or "record" in refused.reason
    good = records(b"fine")
    cm.on_consensus_message(append(data=good, commit_position=0), SECOND + MS)
    assert bytes(cm.log.buffer) == good  # the next good append is taken


def test_a_new_term_that_cannot_begin_where_it_says_is_refused() -> None:
    # a log's terms only move forward: a forged base before the last term's base raised
    # inside the term history (and stopped the node)
    cm, _disk, _applied = follower()
    one, two = records(b"a" * 10), records(b"b" * 10)  # 18 bytes each
    cm.on_consensus_message(AppendRequest(2, 1, 0, -1, 1, 0, 0, one), SECOND)
    cm.on_consensus_message(AppendRequest(2, 1, 18, 1, 2, 18, 0, two), SECOND + MS)
    assert cm.log.published_position == 36
    forged = AppendRequest(3, 1, 36, 2, 3, 10, 0, records(b"c" * 10))  # term 3 "at 10"
    cm.on_consensus_message(forged, SECOND + 2 * MS)
    assert cm.log.published_position == 36
    assert cm.counters.invalid_messages == 1
    good = AppendRequest(3, 1, 36, 2, 3, 36, 0, records(b"c" * 10))
    cm.on_consensus_message(good, SECOND + 3 * MS)
    assert cm.log.published_position == 54


def test_an_append_that_does_not_line_up_with_the_log_is_refused() -> None:
    cm, _disk, _applied = follower()
    first = records(b"a" * 10, b"b" * 10)  # two records, 36 bytes, term 1
    cm.on_consensus_message(append(data=first), SECOND)
    assert cm.log.published_position == len(first) == 36
    # the same term from 0 again, as one 38-byte record: the bytes this log already
    # holds (36) are skipped as the same entries, and what is left would start inside
    # that record: refused, not appended
    cm.on_consensus_message(append(data=records(b"c" * 30)), SECOND + MS)
    assert cm.counters.invalid_messages == 1
    assert bytes(cm.log.buffer) == first


def test_a_follower_commits_only_what_it_has_durably_written() -> None:
    cm, disk, applied = follower()
    data = records(b"one", b"two")
    cm.on_consensus_message(append(data=data, commit_position=len(data)), SECOND)
    # received, verified, and the leader says it is committed: not durable here yet
    assert cm.commit_position == 0
    MemoryShell(cm, disk, applied, SECOND).persist()
    assert cm.log.archive_position == len(data)
    assert cm.commit_position == len(data)


def leader_of_three() -> tuple[Cluster, ConsensusModule]:
    c = Cluster(3, seed=4)
    c.run_until(lambda: c.leader() is not None)
    leader = c.leader()
    assert leader is not None
    return c, leader


def test_a_report_beyond_the_leaders_log_is_refused() -> None:
    # the third attack: forged VERIFIED reports at position 2**40 from both followers
    c, leader = leader_of_three()
    commit = leader.commit_position
    term = leader.leadership_term_id
    for member in (p.member_id for p in leader.followers):
        leader.on_consensus_message(
            AppendPosition(term, 2**40, member, APPEND_POSITION_VERIFIED), c.now
        )
    assert leader.commit_position == commit
    assert leader.counters.invalid_messages == 2


def test_the_leaders_commit_never_passes_its_own_durable_log() -> None:
    c, leader = leader_of_three()
    c.append(b"not yet durable on the leader")
    end = leader.log.published_position
    durable = leader.log.archive_position
    assert end > durable
    term = leader.leadership_term_id
    for member in (p.member_id for p in leader.followers):
        leader.on_consensus_message(
            AppendPosition(term, end, member, APPEND_POSITION_VERIFIED), c.now
        )
    assert leader.commit_position == durable


def test_a_leader_with_a_live_quorum_ignores_a_disrupting_candidate() -> None:
    # the fifth attack: RequestVote with a high term, again and again
    c, leader = leader_of_three()
    term = leader.leadership_term_id
    for k in range(5):
        c.step()
        for cm in c.members.values():
            cm.on_consensus_message(RequestVote(0, 0, term + 10 + k, 2, 0), c.now)
        c.step()
    assert leader.is_ready_leader
    assert leader.leadership_term_id == term
    assert all(cm.leadership_term_id == term for cm in c.members.values())


def test_a_term_far_beyond_the_members_own_is_refused() -> None:
    # the fourth attack's cousin: a term that is valid on the wire but would leave the
    # cluster no terms to elect in
    c, leader = leader_of_three()
    follower = next(cm for cm in c.members.values() if cm is not leader)
    term = follower.candidate_term_id
    follower.on_consensus_message(
        CommitPosition(term + MAX_TERM_STEP + 1, 0, leader.config.member_id), c.now
    )
    assert follower.candidate_term_id == term
    assert follower.counters.invalid_messages == 1
    follower.on_consensus_message(
        RequestVote(0, 0, MAX_TERM, 3 - leader.config.member_id, 0), c.now
    )
    assert follower.candidate_term_id == term
    c.run_until(lambda: c.leader() is leader and leader.commit_position > 0)


def forged_later_terms(c: Cluster, dead: int, target: ConsensusModule) -> list[object]:
    """Every message of a later term that could depose a leader, in ``dead``'s name,
    each made to pass the ``target``'s log checks (an empty append lined up with its
    log, a commit position it holds)."""
    term = target.leadership_term_id + 1
    end = target.log.published_position
    prev = target.log.terms.term_at(end)
    commit = target.commit_position
    return [
        AppendRequest(term, dead, end, prev, prev, 0, commit, b""),
        CommitPosition(term, commit, dead),
        AppendPosition(term, end, dead, 0),
        AppendPosition(term, commit, dead, APPEND_POSITION_VERIFIED),
        SnapshotChunk(term, dead, commit, prev, 0, 100, 0, 0, b""),  # a probe
    ]


@pytest.mark.parametrize("kind", range(5))
def test_a_later_term_in_a_dead_members_name_deposes_no_live_leader(kind: int) -> None:
    """The issue's attack: member 2 is dead; a stranger dials the live members as member
    2 (no TLS: its link is free) and sends a message of a later term.  Before, each
    followed member 2 (an append, a commit position), or stepped down (a report), and no
    write committed until their heartbeat timeout ran out.  Now both keep their leader,
    and writes commit on every step of it."""
    c = Cluster(3, seed=5)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    dead = next(i for i in range(3) if i != me)
    live = next(i for i in range(3) if i not in (me, dead))
    c.down.add(dead)
    for _ in range(50):  # past the election timeout (300 ms here) since it last spoke
        c.step()
    follower = c.members[live]
    for k in range(100):  # forgeries to each member, one in every ten writes
        if k % 10 == 0:
            for target in (follower, leader):
                target.on_consensus_message(forged_later_terms(c, dead, target)[kind], c.now)
        c.append(f"w{k}".encode())
        end = leader.log.published_position
        c.run_until(lambda end=end: leader.commit_position >= end, limit=5)  # 50 ms
        assert leader.is_ready_leader
        assert leader.leadership_term_id == term
        assert follower.leader_member_id == me
    assert follower.candidate_term_id == term
    assert leader.counters.later_terms_ignored + follower.counters.later_terms_ignored >= 10


def test_a_later_term_is_heard_when_the_leader_is_gone_or_the_sender_reported() -> None:
    """What the lease keeps out is only what a live leader makes impossible: a follower
    whose leader has been silent for an election timeout follows a later term's leader,
    and a leader hears of a later term from a follower that reported to it lately."""
    c = Cluster(3, seed=6)
    leader = c.leader_with_a_committed_entry()
    me, term = leader.config.member_id, leader.leadership_term_id
    a, b = (i for i in range(3) if i != me)
    follower = c.members[a]
    heartbeat = forged_later_terms(c, b, follower)[0]
    follower.on_consensus_message(heartbeat, c.now)
    assert follower.leader_member_id == me
    c.down.add(me)
    for _ in range(31):  # its leader silent for the election timeout (300 ms)
        c.step()
    follower.on_consensus_message(heartbeat, c.now)
    assert follower.leader_member_id == b
    assert follower.leadership_term_id == term + 1
    # a leader in lease: a report of a later term from a follower that reports to it
    c = Cluster(3, seed=7)
    leader = c.leader_with_a_committed_entry()
    a = next(i for i in range(3) if i != leader.config.member_id)
    term = leader.leadership_term_id
    leader.on_consensus_message(AppendPosition(term + 1, 0, a, 0), c.now)
    assert leader.role is Role.FOLLOWER


def test_a_member_stuck_in_a_later_term_rejoins() -> None:
    """A member cut off for a while comes back in a later term than the leader's (it
    nominated in a race the leader won, or counted a forged canvass): it refuses the
    leader's appends and answers with its term.  The leader's messages reach it, so the
    leader steps down for it, though it has not reported in this term (found by the
    simulator, seed 1020: the member was left out for good)."""
    c = Cluster(3, seed=9)
    leader = c.leader_with_a_committed_entry()
    term = leader.leadership_term_id
    stuck = next(i for i in range(3) if i != leader.config.member_id)
    c.net.cut |= {(stuck, o) for o in range(3)} | {(o, stuck) for o in range(3)}
    c.run_until(lambda: c.members[stuck].in_election, limit=200)
    assert c.members[stuck].set_candidate_term(term + 3)
    for _ in range(50):
        c.step()
    c.net.cut.clear()
    c.run_until(
        lambda: (
            (new := c.leader()) is not None
            and new.leadership_term_id > term + 3
            and c.members[stuck].leader_member_id == new.config.member_id
        ),
        limit=500,
    )


def test_a_hand_over_whose_vote_request_one_follower_missed_still_ends_with_it_following() -> None:
    """The honest case the lease delays: the hand-over's RequestVote to the third member
    is lost, so it never voted and still hears its old leader for a moment; the new
    leader, elected by the old one's vote, commits at once, and the third member follows
    it an election timeout after its old leader stopped leading."""
    c = Cluster(3, seed=8)
    leader = c.leader_with_a_committed_entry()
    me = leader.config.member_id
    a, b = (i for i in range(3) if i != me)
    c.net.cut |= {(a, b)}
    assert leader.handover.start(c.now, a, "test") == ""
    c.run_until(lambda: c.leader() is c.members[a], limit=200)
    new = c.members[a]
    c.append(b"after the hand-over")
    end = new.log.published_position
    c.run_until(lambda: new.commit_position >= end, limit=100)
    c.net.cut.clear()
    c.run_until(lambda: c.members[b].leader_member_id == a, limit=60)  # 600 ms
    assert c.members[b].counters.later_terms_ignored > 0  # it did wait out its lease


def test_a_leader_that_lost_its_quorum_does_step_down() -> None:
    c, leader = leader_of_three()
    me = leader.config.member_id
    c.down.update(i for i in c.members if i != me)
    c.run_until(lambda: leader.role is not Role.LEADER, limit=400)


# ---------------------------------------------------------------------- fuzzing


record_bodies = st.lists(st.binary(min_size=0, max_size=40), min_size=0, max_size=6)
data = st.one_of(
    record_bodies.map(lambda bodies: records(*bodies)),
    st.binary(max_size=64),
    record_bodies.flatmap(
        lambda bodies: st.integers(0, max(0, len(records(*bodies)))).map(
            lambda cut, bodies=bodies: records(*bodies)[cut:]
        )
    ),
)
appends = st.builds(
    AppendRequest,
    leadership_term_id=st.integers(-1, 6),
    leader_member_id=st.sampled_from([1, 2, 0, 5]),
    log_position=st.integers(0, 300),
    prev_term_id=st.integers(-1, 6),
    data_term_id=st.integers(-1, 6),
    term_base_log_position=st.integers(0, 300),
    commit_position=st.integers(0, 600),
    data=data,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(appends, max_size=12))
def test_the_follower_append_path_survives_any_messages(messages: list[AppendRequest]) -> None:
    """Whatever a peer sends (as the node does it: checked first, then the module),
    the follower never raises, keeps whole CRC-valid records, and commits only what it
    holds durably."""
    cm, disk, applied = follower()
    shell = MemoryShell(cm, disk, applied, SECOND)
    for now, message in enumerate(messages, start=1):
        if check_consensus_message(message, MEMBERS, 0) is not None:
            continue
        cm.on_consensus_message(message, SECOND + now * MS)
        shell.persist()
        assert check_records(bytes(disk)) is None
        assert check_records(bytes(cm.log.buffer)) is None
        assert cm.commit_position <= cm.log.archive_position
        assert cm.commit_position <= len(disk)
        assert sum(1 for _ in iter_records(bytes(disk))) >= 0


reports = st.builds(
    AppendPosition,
    leadership_term_id=st.integers(-1, 4),
    log_position=st.one_of(st.integers(0, 400), st.just(2**40), st.just(MAX_POSITION)),
    follower_member_id=st.sampled_from([1, 2]),
    flags=st.sampled_from([0, APPEND_POSITION_VERIFIED]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(reports, max_size=15))
def test_the_leaders_commit_survives_any_follower_reports(msgs: list[AppendPosition]) -> None:
    """Forged or buggy reports never move the leader's commit past its own durable log,
    never move it back, and never raise."""
    c, leader = leader_of_three()
    c.append(b"one")
    c.append(b"two")
    me = leader.config.member_id
    c.persist(me)
    commit = leader.commit_position
    for msg in msgs:
        message = AppendPosition(
            leader.leadership_term_id if msg.leadership_term_id < 0 else msg.leadership_term_id,
            msg.log_position,
            msg.follower_member_id if msg.follower_member_id != me else 3 - me,
            msg.flags,
        )
        if check_consensus_message(message, (0, 1, 2), me) is not None:
            continue
        leader.on_consensus_message(message, c.now)
        assert leader.commit_position <= leader.log.archive_position
        assert leader.commit_position >= commit
        commit = leader.commit_position


# ---------------------------------------------------------------------- node state


def test_node_state_never_saves_what_a_message_could_not_carry(tmp_path: Path) -> None:
    state = NodeState(tmp_path)
    state.save(candidate_term_id=5)
    with pytest.raises(ValueError, match="out of range"):
        state.save(candidate_term_id=2**63)
    assert NodeState(tmp_path).candidate_term_id == 5


def test_a_bad_node_state_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node-state.json"
    path.write_text(json.dumps({"candidate_term_id": 2**64, "commit_position": 0}))
    with pytest.raises(ArchiveCorruptionError, match=r"node-state\.json.*out of range"):
        NodeState(tmp_path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_appends_that_follow_the_log_survive_any_terms_and_bases(data: st.DataObject) -> None:
    """Appends drawn against the follower's own state (at its end or inside its log,
    with its own previous term or another, terms and bases anywhere), so the term
    history is exercised: the follower never raises, keeps whole records, and its
    terms only move forward."""
    cm, disk, applied = follower()
    shell = MemoryShell(cm, disk, applied, SECOND)
    for step in range(data.draw(st.integers(1, 15))):
        rlog = cm.log
        end = rlog.published_position
        at = data.draw(st.one_of(st.just(end), st.integers(0, end)))
        prev = data.draw(st.one_of(st.just(rlog.terms.term_at(at)), st.integers(-1, 8)))
        data_term = data.draw(st.integers(max(prev, -1), 8))
        term = data.draw(st.integers(data_term, 9))
        base = data.draw(st.one_of(st.just(at), st.integers(0, at)))
        bodies = data.draw(st.lists(st.binary(min_size=1, max_size=20), max_size=4))
        message = AppendRequest(term, 1, at, prev, data_term, base, 0, records(*bodies))
        if check_consensus_message(message, MEMBERS, 0, 1) is not None:
            continue
        cm.on_consensus_message(message, SECOND + step * MS)
        shell.persist()
        assert check_records(bytes(disk)) is None
        history = list(rlog.terms)
        assert [t for t, _ in history] == sorted({t for t, _ in history})
        assert [b for _, b in history] == sorted(b for _, b in history)


def test_an_append_inside_one_of_its_records_is_refused() -> None:
    """Found by hypothesis: a (buggy or forged) leader's append that starts inside one
    of the follower's uncommitted records, with a matching previous term, truncated the
    log in the middle of that record.  A follower cuts its log only where one of its
    records ends (it keeps those of its uncommitted tail)."""
    cm, disk, applied = follower()
    shell = MemoryShell(cm, disk, applied, SECOND)
    cm.on_consensus_message(AppendRequest(0, 1, 0, -1, 0, 0, 0, records(b"\x00")), SECOND)
    shell.persist()
    cm.on_consensus_message(AppendRequest(1, 1, 1, 0, 1, 1, 0, records(b"\x00")), SECOND + MS)
    shell.persist()
    assert check_records(bytes(disk)) is None
    assert cm.counters.invalid_messages == 1
    assert len(disk) == 9  # the first record, whole


def test_a_hand_over_message_is_checked_like_the_others() -> None:
    """TimeoutNow from the wire: a term out of range, a hand-over to another member, or
    one naming a leader other than the link's sender is refused; the real one passes."""
    from cluster.protocol.consensus import TimeoutNow

    members = (0, 1, 2)
    assert check_consensus_message(TimeoutNow(4, 1, 0), members, 0, sender=1) is None
    assert check_consensus_message(TimeoutNow((1 << 62) + 1, 1, 0), members, 0, sender=1)
    assert check_consensus_message(TimeoutNow(4, 1, 2), members, 0, sender=1)
    assert check_consensus_message(TimeoutNow(4, 2, 0), members, 0, sender=1)
    assert check_consensus_message(TimeoutNow(4, 0, 0), members, 0, sender=None)
