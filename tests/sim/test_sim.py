"""Whole clusters of real nodes on a simulated network under virtual time, many seeds.

Each test is a plain function: the harness calls ``trio.run`` itself with its own
``MockClock``.  A failure prints ``SIM SEED <n> failed: <invariant>; replay with: ...``.
The big sweeps are marked ``slow``; ``-m "not slow"`` still runs a smoke sweep and the
named scenarios.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from cluster.config import NodeConfig
from cluster.protocol import PROTOCOL_VERSION, encode_frame
from cluster.protocol.consensus import AppendRequest, MemberHello
from cluster.protocol.enums import Role

from .harness import CONSENSUS_PORT, Scenario, SimCluster, SimFailure, SimResult
from .run import Pool

ROOT = Path(__file__).resolve().parents[2]

SWEEP_SAFETY = 6.0  # virtual seconds of faults per sweep seed: many short seeds
SWEEP_3 = range(1000, 1000 + int(os.environ.get("SIM_SEEDS_3", "32")))
SWEEP_5 = range(5000, 5000 + int(os.environ.get("SIM_SEEDS_5", "10")))
SWEEP_WORKERS = int(os.environ.get("SIM_WORKERS", "0")) or os.cpu_count() or 1
SMOKE = range(1, 6)

KNOWN_BUGS: list[tuple[str, str]] = []
"""(regex over the failure reason, why): open node bugs, reported with a replay seed.  A
seed failing this way is an expected failure (it passes once the bug is fixed); any other
failure fails the test."""


def _sim(
    seed: int,
    nodes: int,
    tmp_path: Path,
    scenario: Scenario | None = None,
    **overrides: object,
) -> tuple[SimCluster, SimResult]:
    sim = SimCluster(seed, nodes, tmp_path, **overrides)
    try:
        return sim, sim.run(scenario)
    except SimFailure as exc:
        for pattern, reason in KNOWN_BUGS:
            if re.search(pattern, exc.reason):
                pytest.xfail(f"{reason}: {exc.reason}")
        raise


def _run(seed: int, nodes: int, tmp_path: Path, **overrides: object) -> SimResult:
    return _sim(seed, nodes, tmp_path, keep_dirs=False, **overrides)[1]


@pytest.fixture(scope="session")
def sweep(request: pytest.FixtureRequest) -> Iterator[Pool]:
    """Every selected sweep seed, run ahead in worker processes (one per core)."""
    jobs = [
        (item.callspec.params["seed"], SWEEP_TESTS[item.originalname])
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname in SWEEP_TESTS
    ]
    pool = Pool(jobs, SWEEP_WORKERS, {"safety_duration": SWEEP_SAFETY})
    try:
        yield pool
    finally:
        pool.close()


def _check_sweep(pool: Pool, seed: int, nodes: int) -> None:
    result = pool.result(seed, nodes)
    if result.ok:
        return
    for pattern, reason in KNOWN_BUGS:
        if re.search(pattern, result.reason):
            pytest.xfail(f"{reason}: {result.reason}")
    pytest.fail(result.text, pytrace=False)


# ---------------------------------------------------------------------- sweeps


@pytest.mark.parametrize("seed", SMOKE)
def test_smoke_3_nodes(seed: int, tmp_path: Path) -> None:
    _run(seed, 3, tmp_path, safety_duration=5.0)


@pytest.mark.parametrize(("seed", "nodes"), [(11, 3), (12, 3), (13, 5)])
def test_adversary_on_the_consensus_ports(seed: int, nodes: int, tmp_path: Path) -> None:
    """Random, replayed, mutated and forged member messages (``adversary.py``) during
    the faults: no member crashes, the invariants hold at every step, the cluster is
    live again once the adversary stops.  (The sweeps give a third of their seeds an
    adversary too.)"""
    result = _run(seed, nodes, tmp_path, safety_duration=5.0, adversary=True)
    assert result.stats["adversary_connections"] > 5


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_3)
def test_sweep_3_nodes(seed: int, sweep: Pool) -> None:
    _check_sweep(sweep, seed, 3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP_5)
def test_sweep_5_nodes(seed: int, sweep: Pool) -> None:
    _check_sweep(sweep, seed, 5)


SWEEP_TESTS = {"test_sweep_3_nodes": 3, "test_sweep_5_nodes": 5}


# ---------------------------------------------------------------------- determinism


def test_same_seed_same_trace(tmp_path: Path) -> None:
    first = SimCluster(7, 3, tmp_path / "a", safety_duration=4.0).run()
    second = SimCluster(7, 3, tmp_path / "b", safety_duration=4.0).run()
    assert first.trace_hash == second.trace_hash
    assert first.history == second.history
    other = SimCluster(8, 3, tmp_path / "c", safety_duration=4.0).run()
    assert other.trace_hash != first.trace_hash


def test_trace_does_not_depend_on_hash_seed() -> None:
    """Trio's deterministic scheduling is private API: a Trio upgrade could break it."""
    hashes = set()
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-m", "tests.sim.run", "--seed", "3", "--nodes", "3", "--safety", "3"],
            cwd=ROOT,
            env=os.environ | {"PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        hashes.add(out.split(" hash ")[1].split()[0])
    assert len(hashes) == 1


# ---------------------------------------------------------------------- scenarios


def test_single_member_cluster_keeps_acknowledged_writes_across_torn_crashes(
    tmp_path: Path,
) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        for _ in range(3):
            await sim.sleep(1.0)
            await sim.crash(0, torn=True)
            await sim.sleep(0.3)
            await sim.restart(0)
        await sim.sleep(1.0)

    sim, result = _sim(11, 1, tmp_path, scenario)
    assert result.stats["torn"] == 3
    assert len(sim.history.acked) > 20
    assert any("torn tail" in line for line in sim.log_lines)


def test_leader_isolated_from_the_majority(tmp_path: Path) -> None:
    """A new leader is elected; the old leader's uncommitted entries are truncated, the
    committed ones kept (the checker verifies every acknowledged write at the end)."""
    seen: dict[str, int] = {}

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        old = await sim.wait_for_leader()
        await sim.sleep(1.0)
        old_term = sim.term_of(old)
        sim.partition([old], [i for i in range(3) if i != old])
        await sim.wait_for(
            "no new leader in the majority",
            lambda: any(
                sim.role_of(i) is Role.LEADER and sim.term_of(i) > old_term
                for i in range(3)
                if i != old
            ),
            5.0,
        )
        await sim.sleep(1.0)  # the old leader keeps taking (uncommitted) client writes
        seen["old"] = old
        sim.heal()
        await sim.wait_for(
            "the old leader did not rejoin as follower",
            lambda: sim.role_of(old) is Role.FOLLOWER and sim.term_of(old) > old_term,
            5.0,
        )
        await sim.sleep(1.0)

    sim, _ = _sim(21, 3, tmp_path, scenario, clients=3, client_window=4)
    old_node = sim.nodes[seen["old"]].node
    assert old_node is not None
    assert old_node.cm.counters.truncations >= 1
    assert len(sim.history.acked) > 20


def test_a_replaced_leader_that_never_notices_answers_no_query_from_its_old_state(
    tmp_path: Path,
) -> None:
    """(9), ReadIndex's reason to be: the leader is cut off from the other members with
    its clock stopped, so no timeout of its own tells it that it was replaced, while the
    clients still reach it.  A reader keeps asking it queries (linearizable and follower)
    after a writer, dialled by the new leader, has written through that one.  No quorum
    answers the old leader's read rounds in its term, so it answers none of them from
    its old state: they are answered by the new leader once the reader moves (with read
    rounds confirmed without a quorum, (9) fails here: a stale read)."""
    seen: dict[str, int] = {}

    async def scenario(sim: SimCluster) -> None:
        writer = sim.new_client(own_egress=False, window=1)
        reader = sim.new_client(own_egress=True, query_share=1.0, window=64)
        sim.add_client(writer)
        sim.add_client(reader)
        old = await sim.wait_for_leader()
        await sim.wait_for(
            "the reader's first queries were not answered",
            lambda: sum(q.answered_at is not None for q in sim.history.queries) >= 5,
            5.0,
        )
        sim.partition([old], [i for i in range(3) if i != old])
        sim.freeze(old)
        stale = _node(sim, old).cm.commit_position

        def asked_stale() -> int:
            """The reader's queries first sent to the old leader after a commit past its own."""
            return sum(
                q.client == reader.index
                and q.first_sent_to == old
                and q.commit_at_first_send > stale
                for q in sim.history.queries
            )

        await sim.wait_for(
            "the reader did not ask the old leader after the new one committed",
            lambda: asked_stale() >= 5,
            5.0,
        )
        seen["old"], seen["asked"] = old, asked_stale()
        await sim.sleep(1.0)
        assert sim.role_of(old) is Role.LEADER  # it still believes it leads
        sim.heal()
        await sim.sleep(1.0)

    sim, _ = _sim(43, 3, tmp_path, scenario)
    old = seen["old"]
    assert seen["asked"] >= 5
    queries = [q for q in sim.history.queries if q.first_sent_to == old]
    assert all(q.answered_at is not None for q in sim.history.queries)
    levels = {q.level for q in queries}
    assert levels == {"linearizable", "follower"}
    assert sim.checker.queries.checked >= len(sim.history.queries)


def test_crash_restart_with_torn_tail(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        follower = (leader + 1) % 3
        await sim.crash(follower, torn=True)
        await sim.sleep(1.0)
        await sim.restart(follower)
        await sim.sleep(1.0)
        await sim.crash(leader, torn=True)
        await sim.wait_for_leader()
        await sim.sleep(1.0)
        await sim.restart(leader)
        await sim.sleep(1.0)

    sim, result = _sim(31, 3, tmp_path, scenario)
    assert result.stats["torn"] == 2
    assert sum("torn tail" in line for line in sim.log_lines) == 2
    assert len(result.terms) >= 2


def test_all_members_restart(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        await sim.wait_for_leader()
        await sim.sleep(2.0)
        for i in range(3):
            await sim.crash(i, torn=i == 1)
        await sim.sleep(0.5)
        for i in range(3):
            await sim.restart(i)
        await sim.wait_for_leader()
        await sim.sleep(2.0)

    sim, result = _sim(41, 3, tmp_path, scenario)
    assert result.stats["crashes"] == 3
    assert len(sim.history.acked) > 20


def test_a_majority_restarted_without_a_member_elects_at_once(tmp_path: Path) -> None:
    """Every member crashes; two of three start again, the third only later: a leader
    within the default start-up canvass timeout and an election timeout (was: none
    until the third came back, or a minute), writes go on, and the third catches up
    (the liveness phase waits for every member to apply the same log)."""
    startup_canvass = NodeConfig().startup_canvass_timeout / 1e9
    took: list[float] = []

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        await sim.wait_for_leader()
        await sim.sleep(1.0)
        for i in range(3):
            await sim.crash(i, torn=i == 2)
        await sim.sleep(0.5)
        await sim.restart(0)
        await sim.restart(1)
        started = trio.current_time()
        await sim.wait_for_leader()
        took.append(trio.current_time() - started)
        acked = len(sim.history.acked)
        await sim.wait_for("writes after the restart", lambda: len(sim.history.acked) > acked, 5)
        await sim.sleep(2.0)
        await sim.restart(2)
        await sim.sleep(1.0)

    _sim(43, 3, tmp_path, scenario, startup_canvass_timeout=NodeConfig().startup_canvass_timeout)
    election_timeout = 0.3  # the simulator's
    assert took[0] < startup_canvass + election_timeout, took


def test_a_later_term_forged_in_a_crashed_members_name_deposes_no_leader(tmp_path: Path) -> None:
    """A stranger dials both live members' consensus ports as the crashed member and
    sends heartbeats of a later term lined up with each one's log, five a second for
    three seconds: the leader and its term stay, and writes are acknowledged throughout
    (was: both followed the forger and nothing was acknowledged for a heartbeat
    timeout and an election)."""
    gaps: list[float] = []
    ignored: list[int] = []

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        dead = (leader + 1) % 3
        await sim.crash(dead)
        await sim.sleep(1.0)
        term = sim.term_of(leader)
        host = sim.net.host("forger")
        start = trio.current_time()
        for _ in range(15):
            for target in range(3):
                if target == dead:
                    continue
                cm = _node(sim, target).cm
                end = cm.log.published_position
                prev = cm.log.terms.term_at(end)
                forged = AppendRequest(term + 1, dead, end, prev, prev, 0, cm.commit_position, b"")
                stream = await host.open_stream(sim.nodes[target].host, CONSENSUS_PORT)
                await stream.send_all(
                    encode_frame(MemberHello(dead, PROTOCOL_VERSION)) + encode_frame(forged)
                )
                await trio.aclose_forcefully(stream)
            await sim.sleep(0.2)
            assert sim.leader() == leader
            assert sim.term_of(leader) == term
        acks = sorted(
            op.acked_at
            for op in sim.history.acked
            if op.acked_at is not None and op.acked_at >= start
        )
        gaps.extend(b - a for a, b in itertools.pairwise([start, *acks, trio.current_time()]))
        ignored.extend(_node(sim, i).cm.counters.later_terms_ignored for i in range(3) if i != dead)
        await sim.restart(dead)

    _sim(44, 3, tmp_path, scenario, clients=3)
    assert max(gaps) < 0.5, f"no write acknowledged for {max(gaps):.2f} s"
    assert min(ignored) >= 15, ignored  # each live member ignored every forgery


def test_failure_names_the_seed_and_how_to_replay_it(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.wait_for_leader()
        sim.checker.fail("two leaders in term 99: n0 and n1")  # as the checker reports it

    with pytest.raises(SimFailure) as info:
        SimCluster(5, 3, tmp_path).run(scenario, liveness=False)
    message = str(info.value)
    assert message.startswith("SIM SEED 5 failed: two leaders in term 99")
    assert "replay with: .venv/bin/pytest 'tests/sim/test_sim.py::test_failure_names" in message
    with pytest.raises(SimFailure) as info:
        SimCluster(5, 3, tmp_path, safety_duration=0.5, liveness_timeout=0.001).run()
    assert str(info.value).startswith("SIM SEED 5 failed: liveness: ")
    assert "replay with: .venv/bin/python -m tests.sim.run --seed 5 --nodes 3 --safety 0.5" in (
        str(info.value)
    )


def test_livelock_is_reported_not_hung(tmp_path: Path) -> None:
    async def scenario(sim: SimCluster) -> None:
        await sim.wait_for_leader()
        while True:  # a task that never lets virtual time move
            await trio.lowlevel.checkpoint()

    with pytest.raises(SimFailure, match="livelock: virtual time stuck"):
        SimCluster(6, 3, tmp_path).run(scenario, liveness=False)


# ---------------------------------------------------------------------- fixed node bugs


def test_restarted_old_leader_keeps_committed_entries(tmp_path: Path) -> None:
    """The leader is cut off and crashes with an uncommitted tail, its saved commit
    position behind the real one; it restarts after a new leader took over.

    Was: one AppendRequest truncated the tail, appended and advanced the commit position
    while the truncation was still pending, so the log agent applied stale bytes (bug A);
    and the member truncated back to its saved commit position, dropping committed
    entries (bug B)."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        old = await sim.wait_for_leader()
        await sim.sleep(1.5)
        sim.partition([old], [i for i in range(3) if i != old])
        await sim.sleep(0.05)  # clients still reach it: an uncommitted tail
        await sim.crash(old)
        await sim.wait_for_leader()
        sim.heal()
        await sim.sleep(1.0)
        await sim.restart(old)
        await sim.sleep(2.0)

    _sim(1, 3, tmp_path, scenario, clients=3, client_window=4)


def test_new_leader_never_reuses_session_ids(tmp_path: Path) -> None:
    """Every member restarts before saving the commit position that covers the open
    sessions; new clients connect during the election.

    Was: a new leader allocated session ids at SessionConnectRequest time, before it had
    mirrored the earlier terms' SessionOpenEvents, and reissued ids of open sessions
    (bug C: a retried request was then applied twice)."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        await sim.wait_for_leader()
        await sim.sleep(0.6)
        for i in range(3):
            await sim.crash(i)
        for i in range(3):
            await sim.restart(i)
        for _ in range(3):
            sim.spawn_client(sim.new_client())
        await sim.wait_for_leader()
        await sim.sleep(2.0)

    _sim(2, 3, tmp_path, scenario, clients=3, client_window=4)


def test_session_survives_an_egress_connection_reset(tmp_path: Path) -> None:
    """Was: an OPEN session whose egress connection broke was never re-dialled."""

    async def scenario(sim: SimCluster) -> None:
        leader = await sim.wait_for_leader()
        client = sim.new_client(window=1, egress_silence=None)
        sim.spawn_client(client)
        await sim.wait_for("no write acknowledged", lambda: len(sim.history.acked) >= 3, 5.0)
        sim.net.reset(client.name, sim.nodes[leader].host)  # ingress and egress
        acked = len(sim.history.acked)
        await sim.wait_for(
            "no write acknowledged after the egress reset",
            lambda: len(sim.history.acked) > acked + 3,
            10.0,
        )

    SimCluster(51, 3, tmp_path).run(scenario)


def test_exact_deadline_wakeups_do_not_livelock(tmp_path: Path) -> None:
    """Was: Replicator.run slept until ``last_send + interval`` but tested
    ``now - last_send >= interval``, so a wake-up exactly on the deadline spun."""
    _sim(1, 3, tmp_path, clock_overshoot=0.0)


# ---------------------------------------------------------------------- exactly once out (#42)


@pytest.mark.parametrize("own_egress", [True, False], ids=["own-egress", "listening"])
def test_replies_given_before_a_leader_crash_reach_the_client_once(
    tmp_path: Path, own_egress: bool
) -> None:
    """Replies the leader gave but could not send (its way to the client blackholed)
    are kept by every member: once it crashes, the new leader sends them, and the
    client gets each once, in order, on the same session (invariant 8 checks every
    step; the end, that none is missing)."""

    async def scenario(sim: SimCluster) -> None:
        leader = await sim.wait_for_leader()
        client = sim.new_client(window=4, own_egress=own_egress, egress_silence=None)
        sim.add_client(client)
        await sim.wait_for("no write acknowledged", lambda: len(sim.history.acked) >= 5, 5.0)
        session = client.session_id
        sim.net.one_way(sim.nodes[leader].host, client.name)
        await sim.wait_for(
            "no reply given to the cut-off client",
            lambda: sim.checker.replies_undelivered(client) >= 3,
            5.0,
        )
        given = len(sim.checker.replies[session])
        received = client.received_reply
        await sim.crash(leader)
        await sim.wait_for(
            "the replies kept were not sent by the new leader",
            lambda: client.received_reply >= given,
            10.0,
        )
        assert client.session_id == session
        assert [n for n, _ in sim.history.delivered[session]] == list(
            range(1, client.received_reply + 1)
        )
        assert client.received_reply - received >= 3
        sim.heal()
        await sim.restart(leader)
        await sim.sleep(1.0)

    _sim(8, 3, tmp_path, scenario, clients=0)


def test_replies_past_the_kept_bound_are_a_gap_the_client_counts(tmp_path: Path) -> None:
    """With room for two replies kept, a client cut off from its leader while four were
    given gets the last two from the next leader: a gap of two it counts (the members
    dropped them), never a reply twice or out of order; the session goes on."""

    async def scenario(sim: SimCluster) -> None:
        leader = await sim.wait_for_leader()
        client = sim.new_client(window=4, own_egress=True, egress_silence=None)
        sim.add_client(client)
        await sim.wait_for("no write acknowledged", lambda: len(sim.history.acked) >= 5, 5.0)
        session = client.session_id
        sim.net.one_way(sim.nodes[leader].host, client.name)
        await sim.wait_for(
            "no reply given to the cut-off client",
            lambda: sim.checker.replies_undelivered(client) >= 4,
            5.0,
        )
        given, received = len(sim.checker.replies[session]), client.received_reply
        await sim.crash(leader)
        await sim.wait_for(
            "the replies kept were not sent by the new leader",
            lambda: client.received_reply >= given,
            10.0,
        )
        assert client.session_id == session
        assert session in sim.checker.replies_trimmed
        assert sim.history.reply_gaps[session] == given - 2 - received >= 2
        numbers = [n for n, _ in sim.history.delivered[session]]
        assert numbers == [*range(1, received + 1), given - 1, given]
        sim.heal()
        await sim.restart(leader)

    # two KV replies (about 10 bytes each, and REPLY_OVERHEAD) fit, not three
    _sim(8, 3, tmp_path, scenario, clients=0, max_kept_replies=170)


# ---------------------------------------------------------------------- compaction (#19)


async def _take_snapshot(sim: SimCluster) -> int:
    """A snapshot through a client, taken and recorded by the leader; its position."""
    leader = await sim.wait_for_leader()
    node = sim.nodes[leader].node
    assert node is not None
    before = node.snapshots.taken
    sim.clients[0].request_snapshot()
    await sim.wait_for("a snapshot", lambda: node.snapshots.taken > before, 5.0)
    return node.recording_log.snapshots()[-1].log_position


def _installs(sim: SimCluster, i: int) -> int:
    """Snapshots node ``i`` installed since it (re)started."""
    sn = sim.nodes[i]
    catchup = getattr(sn.node, "catchup", None) if sn.running else None
    return 0 if catchup is None else int(catchup.installs)


async def _in_the_middle_of_a_transfer(sim: SimCluster, i: int) -> None:
    """Until member ``i`` has received part of a snapshot transfer, not all of it (a
    member's state: nothing signals it, so every half virtual millisecond, 10 s at most)."""

    def in_the_middle() -> bool:
        sn = sim.nodes[i]
        cm = getattr(sn.node, "cm", None) if sn.running else None
        receiver = cm.replica.snapshot if cm is not None else None
        return receiver is not None and receiver.offset > 0 and receiver.complete is None

    with trio.fail_after(10):
        while not in_the_middle():  # noqa: ASYNC110 (node state: nothing signals it)
            await trio.sleep(0.0005)


def _node(sim: SimCluster, i: int) -> Any:
    node = sim.nodes[i].node
    assert node is not None
    return node


async def _compact_without(sim: SimCluster, lagger: int, snapshots: int = 4) -> int:
    """Snapshots (and so compactions) while ``lagger`` is down; the leader's log start."""
    for _ in range(snapshots):
        await sim.sleep(0.3)
        await _take_snapshot(sim)
    leader = await sim.wait_for_leader()
    start: int = _node(sim, leader).archive.start_position
    assert start > 0, "the leader compacted its log"
    return start


def test_member_far_behind_after_compaction_is_sent_a_snapshot(tmp_path: Path) -> None:
    """A member down while the leader took four snapshots (retention 2) needs log the
    leader purged: it is sent the leader's latest snapshot, installs it and catches up
    (the liveness phase then checks every member's store and log)."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(0.5)
        lagger = (leader + 1) % 3
        await sim.crash(lagger)
        behind = _node(sim, leader).archive.position
        start = await _compact_without(sim, lagger)
        assert behind < start
        await sim.restart(lagger)
        await sim.wait_for(
            "the lagging member installs a snapshot",
            lambda: _installs(sim, lagger) >= 1,
            10.0,
        )
        assert _node(sim, lagger).archive.start_position >= start
        await sim.sleep(1.0)

    _, result = _sim(11, 3, tmp_path, scenario, clients=3, segment_size=4 << 10)
    assert result.stats["snapshots_installed"] >= 1
    assert result.stats["compactions"] >= 1


@pytest.mark.parametrize("wipe", [False, True], ids=["crash", "wipe-then-crash"])
def test_crash_in_the_middle_of_a_snapshot_transfer(tmp_path: Path, wipe: bool) -> None:
    """The member receiving a snapshot crashes with part of it written: it starts the
    transfer over after its restart (its temporary file removed) and installs it."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        lagger = (leader + 2) % 3
        behind = _node(sim, leader).archive.position
        if wipe:
            await sim.wipe(lagger)
        else:
            await sim.crash(lagger)
        for _ in range(4):  # until the leader no longer has the log the lagger needs
            if await _compact_without(sim, lagger) > behind:
                break
        await sim.restart(lagger)

        await _in_the_middle_of_a_transfer(sim, lagger)
        await sim.crash(lagger, torn=True)
        temporaries = list((sim.nodes[lagger].dir / "snapshots").glob("install-*.tmp"))
        assert temporaries, "a transfer was under way"
        await sim.restart(lagger)
        await sim.wait_for(
            "the member installs the snapshot after its restart",
            lambda: _installs(sim, lagger) >= 1,
            10.0,
        )
        assert not list((sim.nodes[lagger].dir / "snapshots").glob("install-*.tmp"))
        await sim.sleep(1.0)

    _sim(12, 3, tmp_path, scenario, clients=3, latency=(0.004, 0.012), segment_size=4 << 10)


def test_a_compaction_past_the_snapshot_being_sent_sends_the_latest(tmp_path: Path) -> None:
    """The member receiving a snapshot stalls (paused) while the leader takes another
    and compacts past the first: once it has installed the first it still needs log the
    leader purged, and is sent the latest.  Was (sim seed 161): the leader went on
    probing with the snapshot the member already held, and the member never caught up."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        lagger = (leader + 2) % 3
        behind = _node(sim, leader).archive.position
        await sim.wipe(lagger)
        for _ in range(4):  # until the leader no longer has the log the lagger needs
            if await _compact_without(sim, lagger) > behind:
                break
        await sim.restart(lagger)
        await _in_the_middle_of_a_transfer(sim, lagger)
        sending = _node(sim, leader).recording_log.snapshots()[-1].log_position
        sim.pause(lagger, 2.0)
        for _ in range(6):  # until the leader's log begins past the snapshot being sent
            await _take_snapshot(sim)
            if _node(sim, leader).archive.start_position > sending:
                break
            await sim.sleep(0.3)
        assert _node(sim, leader).archive.start_position > sending
        await sim.wait_for(
            "the member installs the latest snapshot after the one it was sent",
            lambda: _installs(sim, lagger) >= 2,
            10.0,
        )
        await sim.sleep(1.0)

    _sim(
        12,
        3,
        tmp_path,
        scenario,
        clients=3,
        latency=(0.004, 0.012),
        segment_size=4 << 10,
        archive_retention=1,
    )


def test_compaction_racing_a_lagging_follower(tmp_path: Path) -> None:
    """A follower keeps falling behind (its links clogged) while the leader snapshots
    and compacts every few hundred milliseconds with retention 1: catch-up reads race
    the purges, and whichever wins, the follower gets the log or a snapshot."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        lagger = (leader + 1) % 3
        for round_ in range(10):
            sim.pause(lagger, 0.25 + 0.05 * (round_ % 3))
            await sim.sleep(0.1)
            await _take_snapshot(sim)
            await sim.sleep(0.2)
        await sim.sleep(1.0)

    _, result = _sim(
        13, 3, tmp_path, scenario, clients=3, archive_retention=1, segment_size=4 << 10
    )
    assert result.stats["compactions"] >= 3


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_a_wiped_member_rejoins_as_a_catch_up_member(tmp_path: Path, role: str) -> None:
    """A member (the leader, or a follower) loses its disk under load and restarts on an
    empty one: it votes for nobody until caught up, then votes again; the checker sees
    every acknowledged write kept.  Then the issue's case: with the wiped member caught
    up, another member is wiped, and so on round the cluster."""

    async def scenario(sim: SimCluster) -> None:
        def voting(i: int) -> bool:
            cm = getattr(sim.nodes[i].node, "cm", None)
            return sim.nodes[i].running and cm is not None and not cm.voting.catching_up

        def catching_up(i: int) -> bool:
            cm = getattr(sim.nodes[i].node, "cm", None)
            return sim.nodes[i].running and cm is not None and cm.voting.catching_up

        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        first = leader if role == "leader" else (leader + 1) % 3
        for victim in (first, (first + 1) % 3, (first + 2) % 3):
            await sim.wipe(victim)
            await sim.sleep(0.5)
            await sim.restart(victim)
            await sim.wait_for(
                f"member {victim} up, catching up", partial(catching_up, victim), 5.0
            )
            await sim.wait_for(f"member {victim} votes again", partial(voting, victim), 15.0)
            await sim.sleep(0.5)

    _, result = _sim(21, 3, tmp_path, scenario, clients=3)
    assert result.stats["wipes"] == 3


@pytest.mark.parametrize("abort", [False, True], ids=["shutdown", "abort"])
def test_a_stopped_cluster_restarts_and_old_actions_stop_no_one(
    tmp_path: Path, abort: bool
) -> None:
    """Issue 41: the cluster is stopped (SHUTDOWN or ABORT) while one member is down;
    every member that applied it stops by itself once and is started again (the
    harness does, as an operator would, and checks it stopped live, in its own term);
    the restarted cluster works, the member that was down meets the entry catching up
    in a later term and goes on, and so does one whose disk is replaced after."""

    async def scenario(sim: SimCluster) -> None:
        await sim.start_workload()
        leader = await sim.wait_for_leader()
        await sim.sleep(1.0)
        late = (leader + 1) % 3
        await sim.crash(late)
        await sim.sleep(0.3)
        assert await sim.stop_cluster(abort)
        await sim.wait_for("the others to stop", lambda: sim.stats["stopped_by_action"] >= 2, 5.0)
        await sim.wait_for_leader(10.0)  # the harness started them again
        await sim.sleep(1.0)
        await sim.restart(late)
        await sim.sleep(2.0)
        wiped = (late + 1) % 3
        await sim.wipe(wiped)
        await sim.restart(wiped)
        await sim.sleep(3.0)
        for i in range(3):
            assert sim.nodes[i].running, sim.node_states()

    sim, result = _sim(61, 3, tmp_path, scenario, clients=2, trace=True)  # INFO lines too
    assert result.stats["stopped_by_action"] == 2
    assert any("does not stop this member" in line for line in sim.log_lines)
