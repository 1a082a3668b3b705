"""Cluster time against a stepped wall clock (issue 44, item 5).

Cluster time is the leader's wall clock, never behind the last timestamp of the log: a
clock stepped back leaves it standing until the clock passes that timestamp again; one
jumped forward moves it on at once, and the timers due by then fire, at most
``POLL_LIMIT`` a cycle (Aeron's rule).  A new leader whose clock is behind never stamps
its first entry before the entries of its predecessor it holds, committed or not.
"""

from __future__ import annotations

from typing import Any

from core_harness import SECOND, Cluster

from cluster.archive.record import iter_records
from cluster.core.timers import POLL_LIMIT
from cluster.protocol import LOG
from cluster.protocol.ingress import SessionMessageHeader
from cluster.protocol.log import NewLeadershipTermEvent, TimerEvent


def _log(cluster: Cluster, member: int) -> list[tuple[int, Any]]:
    """A member's log, less the harness's unstamped entry (``Cluster.append``)."""
    disk = bytes(cluster.disk[member])
    log = [(offset, LOG.decode(body)) for offset, body in iter_records(disk)]
    return [(o, m) for o, m in log if not (type(m) is SessionMessageHeader and m.payload == b"x")]


def _stamp(cluster: Cluster, payload: bytes) -> int:
    """Append a client message on the leader, stamped as the node stamps one."""
    leader = cluster.leader()
    assert leader is not None
    stamp = leader.log.stamp(cluster.now)
    leader.log.append(SessionMessageHeader(leader.leadership_term_id, 1, stamp, payload), True)
    return stamp


def test_a_wall_clock_stepped_back_holds_cluster_time_until_it_passes_it() -> None:
    cluster = Cluster(3)
    leader = cluster.leader_with_a_committed_entry()
    before = _stamp(cluster, b"a")
    assert leader.log.set_epoch_offset(leader.log.epoch_offset_ns - 120 * SECOND) == -120 * SECOND
    cluster.step()
    assert _stamp(cluster, b"b") == before  # not 120 s back
    assert leader.log.cluster_time(cluster.now + 100 * SECOND) == before  # still behind
    assert leader.log.cluster_time(cluster.now + 130 * SECOND) > before  # passed it
    cluster.run_until(lambda: leader.commit_position == leader.log.published_position)
    stamps = [m.timestamp for _, m in _log(cluster, leader.config.member_id)]
    assert stamps == sorted(stamps)


def test_a_forward_jump_fires_the_timers_due_by_then_poll_limit_a_cycle() -> None:
    cluster = Cluster(3)
    leader = cluster.leader_with_a_committed_entry()
    now_ms = leader.log.cluster_time(cluster.now)
    due = 2 * POLL_LIMIT + 5
    for i in range(due):  # due within the next minute
        leader.timers.schedule(100 + i, now_ms + (i + 1) * 1_000)
    leader.timers.schedule(999, now_ms + 3_600_000)  # in an hour
    leader.log.set_epoch_offset(leader.log.epoch_offset_ns + 120 * SECOND)
    fired = [leader.consensus_work(cluster.now) for _ in range(4)]
    assert fired == [POLL_LIMIT, POLL_LIMIT, 5, 0]
    cluster.run_until(lambda: leader.commit_position == leader.log.published_position)
    events = [m for _, m in _log(cluster, leader.config.member_id) if type(m) is TimerEvent]
    assert sorted(e.correlation_id for e in events) == list(range(100, 100 + due))
    assert all(e.timestamp >= now_ms + 120_000 for e in events)
    assert len(leader.timers) == 1  # the one due in an hour waits


def test_a_new_leader_with_a_clock_behind_never_stamps_before_its_predecessor() -> None:
    """The old leader's clock runs two minutes ahead; its last entry reaches the
    followers but is not committed when it dies.  A follower, its clock where it was,
    is elected: its NewLeadershipTermEvent comes after that entry in the log, so its
    timestamp must not be before it (it has not applied that entry: only the
    AppendRequest told it the leader's cluster time)."""
    cluster = Cluster(3)
    old = cluster.leader_with_a_committed_entry()
    old_id = old.config.member_id
    old.log.set_epoch_offset(old.log.epoch_offset_ns + 120 * SECOND)
    ahead = _stamp(cluster, b"from the future")
    for i in range(3):  # acknowledgements lost: the entry is not committed
        if i != old_id:
            cluster.net.cut.add((i, old_id))
    end = old.log.published_position
    cluster.run_until(
        lambda: all(len(cluster.disk[i]) >= end for i in cluster.members if i != old_id)
    )
    assert old.commit_position < end
    cluster.down.add(old_id)
    cluster.net.cut.clear()
    cluster.run_until(
        lambda: (leader := cluster.leader()) is not None and leader.config.member_id != old_id
    )
    new = cluster.leader()
    assert new is not None
    wall_ms = (cluster.now + new.log.epoch_offset_ns) // 1_000_000
    assert wall_ms < ahead - 100_000  # its own clock is behind
    log = _log(cluster, new.config.member_id)
    (event,) = [m for _, m in log if type(m) is NewLeadershipTermEvent and m.log_position >= end]
    assert event.timestamp >= ahead
    stamps = [m.timestamp for _, m in log]
    assert stamps == sorted(stamps), stamps
    cluster.run_until(lambda: new.commit_position >= new.log.published_position)
    assert _stamp(cluster, b"next") >= ahead
