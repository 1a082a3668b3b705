"""Snapshots that take themselves (:mod:`cluster.core.autosnapshot`): the rule alone, in
virtual time, and a ready leader's consensus module asking for them on its slow tick."""

from __future__ import annotations

from typing import Any

from core_harness import NullEgress
from prometheus_client import CollectorRegistry, generate_latest

from cluster.agents.exporter import StatusCollector
from cluster.config import MemberEndpoints
from cluster.core.autosnapshot import FIRST_BACKOFF_MS, MAX_BACKOFF_MS, AutoSnapshot
from cluster.core.base import ConsensusConfig
from cluster.core.consensus import ConsensusModule
from cluster.protocol.admin import IngressStatus, MemberStatus, decode_status, encode_body
from cluster.protocol.consensus import APPEND_POSITION_VERIFIED, AppendPosition
from cluster.protocol.enums import ClusterAction, ModuleState, Role
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import ClusterActionRequest, LogMessage
from cluster.status import member_status
from cluster.tool import Result
from cluster.tool.render import describe_table

MS = 1_000_000
SECOND = 1_000 * MS
KIB = 1 << 10
T0_MS = 1_700_000_000_000
TERM = 2


# ---------------------------------------------------------------------- the rule alone


def test_nothing_is_due_while_the_rule_is_off() -> None:
    auto = AutoSnapshot()
    assert not auto.enabled
    assert auto.due(T0_MS, 1 << 40, TERM) == ""
    auto.configure(0, 0)
    assert auto.due(T0_MS + 10**9, 1 << 40, TERM) == ""


def test_due_once_the_log_bytes_since_the_last_snapshot_reach_the_setting() -> None:
    auto = AutoSnapshot(log_bytes=64 * KIB)
    assert auto.due(T0_MS, 64 * KIB - 1, TERM) == ""  # no snapshot yet: from position 0
    assert "65536 bytes of log since the last snapshot (at 0)" in auto.due(T0_MS, 64 * KIB, TERM)
    auto.on_recorded(100_000, T0_MS, size=1_000)  # whoever asked for it
    assert auto.due(T0_MS, 100_000 + 64 * KIB - 1, TERM) == ""
    assert "(at 100000)" in auto.due(T0_MS, 100_000 + 64 * KIB, TERM)


def test_a_snapshot_larger_than_the_setting_raises_the_threshold_to_its_size() -> None:
    auto = AutoSnapshot(log_bytes=64 * KIB)
    auto.on_recorded(1_000, T0_MS, size=256 * KIB)  # a big state: no more snapshot than log
    assert auto.due(T0_MS, 1_000 + 255 * KIB, TERM) == ""
    assert auto.due(T0_MS, 1_000 + 256 * KIB, TERM) != ""


def test_the_interval_needs_time_and_some_log_since_the_last_snapshot() -> None:
    auto = AutoSnapshot(interval_ms=60_000)
    assert auto.due(T0_MS, 500, TERM) == ""  # no snapshot yet: counts from the first check
    assert auto.due(T0_MS + 59_999, 500, TERM) == ""
    assert "60 s and 500 bytes" in auto.due(T0_MS + 60_000, 500, TERM)
    auto.on_recorded(500, T0_MS + 60_000)
    assert auto.due(T0_MS + 200_000, 500, TERM) == ""  # no log since it: nothing to gain
    assert auto.due(T0_MS + 119_999, 501, TERM) == ""
    assert auto.due(T0_MS + 120_000, 501, TERM) != ""


def test_at_most_one_snapshot_in_flight() -> None:
    auto = AutoSnapshot(log_bytes=KIB)
    assert auto.due(T0_MS, 2 * KIB, TERM)
    auto.on_requested(2 * KIB + 40, TERM)  # on the log, not yet applied
    assert auto.due(T0_MS, 10 * KIB, TERM) == ""
    auto.on_taking(2 * KIB + 40)  # applied: being written
    assert auto.in_flight(TERM)
    assert auto.due(T0_MS, 10 * KIB, TERM) == ""
    auto.on_recorded(2 * KIB + 40, T0_MS)
    assert not auto.in_flight(TERM)
    assert auto.due(T0_MS, 3 * KIB + 39, TERM) == ""
    assert auto.due(T0_MS, 3 * KIB + 40, TERM) != ""


def test_a_request_of_an_earlier_term_is_forgotten_but_a_snapshot_being_written_is_not() -> None:
    auto = AutoSnapshot(log_bytes=KIB)
    auto.on_requested(2 * KIB, TERM)  # the old leader's, cut from the log by the new one
    assert auto.in_flight(TERM)
    assert not auto.in_flight(TERM + 1)
    assert auto.due(T0_MS, 3 * KIB, TERM + 1) != ""
    # a request applied before the new term was ready is being written: not asked again
    auto.on_requested(3 * KIB, TERM + 1)
    auto.on_taking(3 * KIB)
    assert auto.due(T0_MS, 9 * KIB, TERM + 2) == ""
    auto.on_recorded(3 * KIB, T0_MS)
    assert auto.due(T0_MS, 4 * KIB, TERM + 2) != ""


def test_a_failed_snapshot_backs_off_doubling_and_a_recorded_one_resets_it() -> None:
    auto = AutoSnapshot(log_bytes=KIB)
    now = T0_MS
    auto.on_taking(2 * KIB)
    auto.on_failed(2 * KIB)  # a full disk
    assert auto.due(now, 5 * KIB, TERM) == ""  # the wait starts at this check
    assert auto.due(now + FIRST_BACKOFF_MS - 1, 5 * KIB, TERM) == ""
    now += FIRST_BACKOFF_MS
    assert auto.due(now, 5 * KIB, TERM) != ""
    auto.on_failed(-1)
    assert auto.due(now, 5 * KIB, TERM) == ""
    assert auto.due(now + 2 * FIRST_BACKOFF_MS - 1, 5 * KIB, TERM) == ""
    assert auto.due(now + 2 * FIRST_BACKOFF_MS, 5 * KIB, TERM) != ""
    for _ in range(20):
        auto.on_failed(-1)
    assert auto.backoff_ms() == MAX_BACKOFF_MS
    auto.on_recorded(5 * KIB, now)
    assert auto.backoff_ms() == 0
    assert auto.due(now, 6 * KIB, TERM) != ""


def test_nothing_is_asked_for_while_the_disk_has_a_problem() -> None:
    auto = AutoSnapshot(log_bytes=KIB)
    assert auto.due(T0_MS, 2 * KIB, TERM, "disk full: archive failed") == ""
    assert auto.due(T0_MS, 2 * KIB, TERM) != ""


def test_a_restart_counts_from_the_recording_logs_latest_snapshot() -> None:
    auto = AutoSnapshot(log_bytes=KIB, interval_ms=60_000)
    auto.restore(50 * KIB, T0_MS - 30_000, size=100)
    view = auto.view(50 * KIB + 10)
    assert (view.position, view.timestamp_ms, view.log_bytes_since) == (
        50 * KIB,
        T0_MS - 30_000,
        10,
    )
    assert auto.due(T0_MS, 50 * KIB + 10, TERM) == ""
    assert "60 s" in auto.due(T0_MS + 30_000, 50 * KIB + 10, TERM)  # from its time
    auto.restore(40 * KIB, T0_MS, size=100)  # an older one: ignored
    assert auto.view(0).position == 50 * KIB
    empty = AutoSnapshot().view(300)
    assert (empty.position, empty.timestamp_ms, empty.log_bytes_since) == (-1, 0, 300)


# ---------------------------------------------------------------------- in the module


def leader(members: int = 1, *, log_bytes: int = 4 * KIB, interval_ms: int = 0) -> ConsensusModule:
    cm = ConsensusModule(
        ConsensusConfig(member_ids=tuple(range(members)), ingress_endpoints="0=127.0.0.1:1"),
        NullEgress(),
    )
    cm.control.auto.configure(log_bytes, interval_ms)
    appended = cm.control.append
    actions: list[ClusterActionRequest] = []
    ACTIONS[id(cm)] = actions

    def append(message: LogMessage) -> int:  # what cluster control puts on the log
        if isinstance(message, ClusterActionRequest):
            actions.append(message)
        return appended(message)

    cm.control.append = append
    lead(cm, TERM, T0_MS * MS)
    return cm


ACTIONS: dict[int, list[ClusterActionRequest]] = {}


def lead(cm: ConsensusModule, term: int, now: int) -> None:
    cm.become_leader(term, now)
    commit(cm, now)
    assert cm.is_ready_leader


def commit(cm: ConsensusModule, now: int) -> None:
    """Everything published is durable on every member and applied."""
    while cm.take_log_batch() is not None:
        pass
    end = cm.log.published_position
    cm.on_archive_position(end, now)
    for progress in cm.followers:
        cm.on_consensus_message(
            AppendPosition(
                cm.leadership_term_id, end, progress.member_id, APPEND_POSITION_VERIFIED
            ),
            now,
        )
    cm.on_applied(end, now)


def write(cm: ConsensusModule, size: int) -> None:
    cm.log.append(SessionMessageHeader(cm.leadership_term_id, 1, 0, b"v" * size), True)


def snapshot_requests(cm: ConsensusModule) -> int:
    """SNAPSHOT actions cluster control has put on the log."""
    return sum(1 for a in ACTIONS[id(cm)] if a.action is ClusterAction.SNAPSHOT)


def test_a_ready_leader_asks_for_a_snapshot_through_the_log_when_one_is_due() -> None:
    cm = leader()
    now = T0_MS * MS
    write(cm, 2 * KIB)
    assert cm.on_slow_tick(now) == 0
    assert snapshot_requests(cm) == 0
    write(cm, 2 * KIB)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1
    assert cm.control.auto.requested == 1
    position = cm.log.published_position
    for _ in range(5):  # not applied yet: in flight, never asked twice
        write(cm, 8 * KIB)
        cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1
    cm.control.auto.on_taking(position)  # the shell applies it on every member
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1
    cm.control.on_snapshot(position, timestamp=T0_MS, size=100)  # written and recorded
    cm.on_slow_tick(now)  # 40 KiB since: due at once
    assert snapshot_requests(cm) == 2
    view = cm.control.auto.view(cm.log.published_position)
    assert (view.position, view.timestamp_ms) == (position, T0_MS)


def test_no_automatic_snapshot_while_suspended_or_not_a_ready_leader() -> None:
    cm = leader(3)
    now = T0_MS * MS
    ok, _ = cm.control.request(ClusterAction.SUSPEND, now)
    assert ok
    write(cm, 8 * KIB)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 0
    ok, _ = cm.control.request(ClusterAction.RESUME, now)
    assert ok
    assert cm.control.module_state is ModuleState.ACTIVE
    cm.enter_election(now, "test")  # no longer leads
    assert cm.role is Role.FOLLOWER
    cm.on_slow_tick(now)
    cm.control.on_slow_tick(now)
    assert snapshot_requests(cm) == 0
    cm.become_leader(TERM + 1, now)  # leads, not ready yet (its term's entry not applied)
    assert not cm.is_ready_leader
    cm.control.on_slow_tick(now)
    assert snapshot_requests(cm) == 0
    commit(cm, now)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1


def test_a_failed_snapshot_is_retried_after_a_back_off_not_every_tick() -> None:
    cm = leader()
    now = T0_MS * MS
    write(cm, 8 * KIB)
    cm.on_slow_tick(now)
    position = cm.log.published_position
    cm.control.auto.on_taking(position)
    cm.control.on_snapshot(position, "disk full: snapshot at log position 1 failed")
    for tick in range(int(FIRST_BACKOFF_MS / 10) - 1):  # every 10 ms for the back-off
        cm.on_slow_tick(now + tick * 10 * MS)
    assert snapshot_requests(cm) == 1
    cm.on_slow_tick(now + FIRST_BACKOFF_MS * MS)
    assert snapshot_requests(cm) == 2
    # while the shell reports a disk problem, nothing is asked for
    position = cm.log.published_position
    cm.control.auto.on_taking(position)
    cm.control.on_snapshot(position, "disk full")
    cm.control.on_disk("disk full: archive failed")
    cm.on_slow_tick(now + 100 * FIRST_BACKOFF_MS * MS)
    assert snapshot_requests(cm) == 2
    cm.control.on_disk("")  # the second failure's back-off (twice the first) still runs
    cm.on_slow_tick(now + 102 * FIRST_BACKOFF_MS * MS - MS)
    assert snapshot_requests(cm) == 2
    cm.on_slow_tick(now + 102 * FIRST_BACKOFF_MS * MS)
    assert snapshot_requests(cm) == 3


def test_a_new_leader_does_not_ask_again_for_a_snapshot_being_taken() -> None:
    """The old leader's request was committed and applied on the member that now leads:
    its snapshot is being written, so the new leader waits for it."""
    cm = leader(3)
    now = T0_MS * MS
    write(cm, 8 * KIB)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1
    position = cm.log.published_position
    commit(cm, now)
    cm.control.auto.on_taking(position)  # applied: the write is under way
    cm.enter_election(now, "test")
    lead(cm, TERM + 1, now)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1
    cm.control.on_snapshot(position, timestamp=T0_MS)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1  # counting from that snapshot now
    write(cm, 4 * KIB)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 2


def test_an_admin_snapshot_counts_as_the_last_snapshot() -> None:
    cm = leader()
    now = T0_MS * MS
    write(cm, 3 * KIB)
    ok, _ = cm.control.request(ClusterAction.SNAPSHOT, now)  # the operator's
    assert ok
    position = cm.log.published_position
    write(cm, 3 * KIB)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1  # the operator's is in flight
    cm.control.auto.on_taking(position)
    cm.control.on_snapshot(position, timestamp=T0_MS)
    cm.on_slow_tick(now)
    assert snapshot_requests(cm) == 1  # 3 KiB since it
    assert cm.control.auto.requested == 0


def test_the_interval_through_the_module() -> None:
    cm = leader(log_bytes=0, interval_ms=60_000)
    now = T0_MS * MS
    cm.on_slow_tick(now)  # the clock starts
    write(cm, 10)
    cm.on_slow_tick(now + 59 * SECOND)
    assert snapshot_requests(cm) == 0
    cm.on_slow_tick(now + 60 * SECOND)
    assert snapshot_requests(cm) == 1


# ---------------------------------------------------------------------- what operators see


def test_describe_and_metrics_show_the_last_snapshot() -> None:
    cm = leader()
    now = T0_MS * MS
    write(cm, 8 * KIB)
    cm.on_slow_tick(now)
    position = cm.log.published_position
    cm.control.auto.on_taking(position)
    cm.control.on_snapshot(position, timestamp=T0_MS, size=100)
    write(cm, 1000)
    status = member_status(
        0,
        cm,
        now + 90 * SECOND,
        ingress=IngressStatus(),
        links=[],
        members=[],
        snapshots_taken=1,
        uptime_s=1.0,
    )
    assert status.last_snapshot_position == position
    assert status.last_snapshot_time_ms == T0_MS
    assert status.last_snapshot_age_s == 90.0
    assert status.log_bytes_since_snapshot == cm.log.published_position - position
    assert status.snapshot_log_bytes == 4 * KIB
    assert status.auto_snapshots == 1
    decoded = decode_status(encode_body(status))  # what describe sends, decoded
    assert decoded.last_snapshot_position == position
    assert decode_status(b'{"member_id": 1}').last_snapshot_position == -1  # an older member
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    assert f'triarch_last_snapshot_position_bytes{{member="0"}} {float(position)}' in text
    assert 'triarch_last_snapshot_age_seconds{member="0"} 90.0' in text
    assert 'triarch_last_snapshot_timestamp_seconds{member="0"} 1.7e+09' in text
    since = float(status.log_bytes_since_snapshot)
    assert f'triarch_log_bytes_since_snapshot{{member="0"}} {since}' in text
    assert 'triarch_snapshot_log_bytes{member="0"} 4096.0' in text
    assert 'triarch_auto_snapshots_total{member="0"} 1.0' in text
    none = MemberStatus(member_id=0)  # no snapshot yet: no position, no age
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: none))
    text = generate_latest(registry).decode()
    assert 'triarch_last_snapshot_age_seconds{member="0"}' not in text
    assert 'triarch_log_bytes_since_snapshot{member="0"} 0.0' in text


def test_the_describe_table_shows_the_last_snapshot_and_its_age() -> None:
    def answer(member_id: int, **fields: Any) -> Result:
        status = MemberStatus(member_id=member_id, role="FOLLOWER", leader_member_id=0, **fields)
        return Result(MemberEndpoints(member_id, "127.0.0.1", 1, 2, 3), status=status)

    table = describe_table(
        [
            answer(0, last_snapshot_position=1 << 20, last_snapshot_age_s=90.4),
            answer(1),  # no snapshot yet
        ]
    )
    header, first, second = table.splitlines()[:3]
    assert "snapshot" in header.split()
    assert "1048576 (1m30s ago)" in first
    assert second.split()[5] == "-"
