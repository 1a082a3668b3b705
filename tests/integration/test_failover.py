"""Failover with real ``python -m cluster.node`` processes: 3 and 5 member clusters.

A writer keeps puts of unique keys going (one new put every few milliseconds, however
many are still waiting) and records which were acknowledged; the tests kill (SIGKILL) or
freeze (SIGSTOP) leaders under that load and check that a new leader takes over, that the
client carries on in the same session, that every acknowledged write reads back, and
that restarted members catch up byte for byte.  Failover time = from the fault to the
first acknowledgement of a put sent after it; ``pytest -s`` shows the figures.

Slow-marked: skip locally with ``-m "not slow"``.

Known node issue worked around here (seen at start-up): a member can win a term, lose it
before its NewLeadershipTermEvent commits, and win a later term; when that old event
commits and is applied, the leader's term goes back to the old one ("member 0 is LEADER
of term 2" then "member 0 leads term 0: ready at ..."), it deposes itself, and a connect
request it was holding is dropped without an answer.  The first session of each test
therefore retries its connect (printed when it happens).
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

KV = "cluster.examples.kv:KeyValueService"
HEARTBEAT_TIMEOUT = 1.0
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    f"{HEARTBEAT_TIMEOUT:g}s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "10s",
]
FAILOVER_BOUND = 10.0  # seconds, with a 1 s heartbeat timeout
CONNECT_TIMEOUT = 24.0


# ---------------------------------------------------------------------- processes


@contextmanager
def local_cluster(
    nodes: int, directory: Path, args: Sequence[str] = NODE_ARGS
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(nodes, KV, directory, extra_args=args)
    try:
        cluster.start_all(timeout=20)
        yield cluster
    finally:
        for proc in cluster.processes.values():  # a frozen member would ignore SIGTERM
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
        cluster.stop_all()


async def restart(cluster: LocalCluster, member_id: int) -> None:
    cluster.start(member_id)
    await trio.to_thread.run_sync(lambda: cluster.wait_ready(20, member_ids=[member_id]))


def endpoint_of(cluster: LocalCluster, member_id: int) -> str:
    """The ingress endpoints string with only ``member_id`` in it."""
    for part in cluster.ingress_endpoints.split(","):
        if part.partition("=")[0] == str(member_id):
            return part
    raise KeyError(member_id)


def node_log(cluster: LocalCluster, member_id: int) -> str:
    return (cluster.log_dir / f"node-{member_id}.log").read_text(errors="replace")


def archive_bytes(cluster: LocalCluster, member_id: int) -> bytes:
    """The member's whole log: its segment files in position order, concatenated."""
    directory = cluster.directory / f"node-{member_id}" / "archive"
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.seg")))


def common_prefix_identical(logs: Sequence[bytes]) -> bool:
    shortest = min(len(data) for data in logs)
    return all(data[:shortest] == logs[0][:shortest] for data in logs)


async def wait_for(
    predicate: Callable[[], bool], limit: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` (files, logs: nothing to wait on) for up to ``limit`` seconds."""
    with trio.move_on_after(limit):
        while True:
            if predicate():
                return
            await trio.sleep(interval)
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


# ---------------------------------------------------------------------- load


@dataclass(slots=True)
class Ack:
    key: str
    sent: float
    acked: float


@dataclass
class Load:
    """Puts of unique keys, one started every ``interval`` s; records acknowledgements."""

    kv: KeyValueClient
    prefix: str
    interval: float = 0.005
    max_in_flight: int = 400
    acks: list[Ack] = field(default_factory=list)
    acked: dict[str, bytes] = field(default_factory=dict)

    def value(self, key: str) -> bytes:
        return f"value-of-{key}".encode()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        slots = trio.Semaphore(self.max_in_flight)
        async with trio.open_nursery() as nursery:
            task_status.started()
            for i in itertools.count():
                await slots.acquire()
                nursery.start_soon(self._put, f"{self.prefix}-{i}", slots)
                await trio.sleep(self.interval)

    async def _put(self, key: str, slots: trio.Semaphore) -> None:
        try:
            sent = trio.current_time()
            value = self.value(key)
            await self.kv.put(key, value)
            self.acked[key] = value
            self.acks.append(Ack(key, sent, trio.current_time()))
        finally:
            slots.release()

    def first_ack_sent_after(self, moment: float) -> Ack | None:
        return min((a for a in self.acks if a.sent >= moment), key=lambda a: a.acked, default=None)

    def acks_sent_after(self, moment: float) -> int:
        return sum(1 for a in self.acks if a.sent >= moment)

    async def wait_acks_sent_after(self, moment: float, count: int, limit: float) -> None:
        await wait_for(
            lambda: self.acks_sent_after(moment) >= count,
            limit,
            f"{count} acknowledged writes ({len(self.acks)} so far)",
        )

    async def failover_time(self, fault: float, limit: float = FAILOVER_BOUND) -> float:
        """Seconds from ``fault`` to the first acknowledgement of a put sent after it."""
        await self.wait_acks_sent_after(fault, 1, limit)
        first = self.first_ack_sent_after(fault)
        assert first is not None
        return first.acked - fault


@asynccontextmanager
async def running(load: Load) -> AsyncIterator[Load]:
    """Run ``load`` in the background for the duration of the block."""
    async with trio.open_nursery() as nursery:
        await nursery.start(load.run)
        try:
            yield load
        finally:
            nursery.cancel_scope.cancel()


async def unreadable(kv: KeyValueClient, expected: dict[str, bytes]) -> list[str]:
    """Keys of ``expected`` whose value does not read back."""
    bad: list[str] = []
    limiter = trio.CapacityLimiter(100)

    async def check(key: str, value: bytes) -> None:
        async with limiter:
            if await kv.get(key) != value:
                bad.append(key)

    async with trio.open_nursery() as nursery:
        for key, value in expected.items():
            nursery.start_soon(check, key, value)
    return sorted(bad)


@asynccontextmanager
async def kv_session(
    endpoints: str, *, attempts: int = 1
) -> AsyncIterator[tuple[client.ClusterClient, KeyValueClient]]:
    """A session with a KV client whose first put went through.

    ``attempts > 1`` (first session after start-up only): a connect request that a
    leader of a short-lived term accepted and then dropped when it stepped down is
    never answered (the client waits in POLL_RESPONSE until its timeout), so the first
    session after start-up tries again.  Every retry is printed: see the module notes.
    """
    async with AsyncExitStack() as stack:
        for attempt in itertools.count(1):
            try:
                c = await stack.enter_async_context(
                    client.connect(endpoints, connect_timeout=CONNECT_TIMEOUT / attempts)
                )
                break
            except client.ConnectTimeoutError as exc:
                if attempt >= attempts:
                    raise
                print(f"\n[failover] connect attempt {attempt} timed out, retrying: {exc}")
        kv = await stack.enter_async_context(KeyValueClient(c))
        await kv.put("warm-up", b"1")  # the session is open and a leader commits
        yield c, kv


def report(name: str, **figures: float | int) -> None:
    parts = [f"{k}={v:.3f}s" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(f"\n[failover] {name}: {' '.join(parts)}", flush=True)


async def kill_leader_under_load(
    cluster: LocalCluster, c: client.ClusterClient, load: Load
) -> tuple[int, float]:
    """SIGKILL the leader while ``load`` runs; return (old leader, failover time)."""
    await load.wait_acks_sent_after(0.0, 200, 20)
    leader, term, session = c.leader_member_id, c.leadership_term_id, c.cluster_session_id
    fault = trio.current_time()
    cluster.kill(leader)
    failover = await load.failover_time(fault)
    assert c.cluster_session_id == session  # the same session, no reconnect
    assert not c.is_closed
    assert c.leader_member_id != leader
    assert c.leadership_term_id > term
    await load.wait_acks_sent_after(fault, 200, 20)  # and it keeps going
    return leader, failover


# ---------------------------------------------------------------------- tests


def test_sigkill_leader_under_load(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(90):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "kill")
                async with running(load):
                    old, failover = await kill_leader_under_load(cluster, c, load)
                    new, term = c.leader_member_id, c.leadership_term_id
                assert f"member {new} is LEADER of term {term}" in node_log(cluster, new)
                assert await unreadable(kv, load.acked) == []
                report(
                    "sigkill leader (3 nodes)",
                    failover=failover,
                    old_leader=old,
                    new_leader=new,
                    term=term,
                    acked=len(load.acked),
                )
                assert failover < FAILOVER_BOUND

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def test_killed_leader_restarts_and_catches_up(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(90):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "before")
                async with running(load):
                    old, failover = await kill_leader_under_load(cluster, c, load)
                leader = c.leader_member_id
                target = archive_bytes(cluster, leader)  # covers every acknowledged write
                started = trio.current_time()
                await restart(cluster, old)
                await wait_for(
                    lambda: archive_bytes(cluster, old)[: len(target)] == target,
                    30,
                    f"member {old} to catch up to {len(target)} bytes of member {leader}'s log",
                    interval=0.1,
                )
                catch_up = trio.current_time() - started
                more = Load(kv, "after")
                async with running(more):
                    await more.wait_acks_sent_after(0.0, 300, 20)
                assert await unreadable(kv, {**load.acked, **more.acked}) == []
                # The restarted member follows the new writes too.
                target = archive_bytes(cluster, leader)
                await wait_for(
                    lambda: archive_bytes(cluster, old)[: len(target)] == target,
                    20,
                    f"member {old} to replicate the writes made after its restart",
                    interval=0.1,
                )
                report(
                    "restart killed leader",
                    failover=failover,
                    catch_up=catch_up,
                    caught_up_bytes=len(target),
                    acked=len(load.acked) + len(more.acked),
                )

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def test_sigstop_leader_under_load(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(90):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "stop")
                async with running(load):
                    await load.wait_acks_sent_after(0.0, 200, 20)
                    old, term, session = (
                        c.leader_member_id,
                        c.leadership_term_id,
                        c.cluster_session_id,
                    )
                    fault = trio.current_time()
                    cluster.signal(old, signal.SIGSTOP)
                    try:
                        failover = await load.failover_time(fault)
                        new, new_term = c.leader_member_id, c.leadership_term_id
                        assert new != old
                        assert new_term > term
                        assert c.cluster_session_id == session
                        await load.wait_acks_sent_after(fault, 200, 20)
                        await trio.sleep_until(fault + 3 * HEARTBEAT_TIMEOUT)
                        during = load.acks_sent_after(fault)
                        frozen = trio.current_time() - fault
                    finally:
                        cluster.signal(old, signal.SIGCONT)
                    resumed = trio.current_time()
                    assert during >= 200  # writes went on while the old leader was frozen
                    follows = f"member {old} follows leader {new} in term {new_term}"
                    await wait_for(lambda: follows in node_log(cluster, old), 15, repr(follows))
                    await load.wait_acks_sent_after(resumed, 200, 20)
                    assert (c.leader_member_id, c.leadership_term_id) == (new, new_term)
                    assert c.cluster_session_id == session
                # A client that only knows the old leader is sent to the new one.
                async with kv_session(endpoint_of(cluster, old)) as (c2, kv2):
                    assert c2.leader_member_id == new
                    assert c2.leadership_term_id == new_term
                    await kv2.put("via-old-leader", b"ok")
                assert await unreadable(kv, {**load.acked, "via-old-leader": b"ok"}) == []
                target = len(archive_bytes(cluster, new))

                def settled() -> bool:
                    logs = [archive_bytes(cluster, m) for m in range(3)]
                    return min(map(len, logs)) >= target and common_prefix_identical(logs)

                await wait_for(settled, 20, "the three archives to agree", interval=0.1)
                logs = [archive_bytes(cluster, m) for m in range(3)]
                assert common_prefix_identical(logs)
                report(
                    "sigstop leader (3 nodes)",
                    failover=failover,
                    frozen=frozen,
                    old_leader=old,
                    new_leader=new,
                    term=new_term,
                    acked=len(load.acked),
                    archive_bytes=min(map(len, logs)),
                )
                assert failover < FAILOVER_BOUND

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def test_clients_of_a_follower_are_redirected_to_the_leader(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(60):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, _kv):
                leader, term = c.leader_member_id, c.leadership_term_id
            for follower in (m for m in range(3) if m != leader):
                async with kv_session(endpoint_of(cluster, follower)) as (c, kv):
                    assert c.leader_member_id == leader
                    assert c.leadership_term_id == term
                    assert str(leader) in {p.split("=")[0] for p in c.ingress_endpoints.split(",")}
                    load = Load(kv, f"via-{follower}")
                    async with running(load):
                        await load.wait_acks_sent_after(0.0, 100, 20)
                    assert await unreadable(kv, load.acked) == []

    with local_cluster(3, tmp_path) as cluster:
        trio.run(main, cluster)


def test_five_nodes_lose_two_then_quorum(tmp_path: Path) -> None:
    async def main(cluster: LocalCluster) -> None:
        with trio.fail_after(120):
            async with kv_session(cluster.ingress_endpoints, attempts=3) as (c, kv):
                load = Load(kv, "five")
                async with running(load):
                    await load.wait_acks_sent_after(0.0, 200, 20)
                    old, term, session = (
                        c.leader_member_id,
                        c.leadership_term_id,
                        c.cluster_session_id,
                    )
                    follower = next(m for m in range(5) if m != old)
                    fault = trio.current_time()
                    cluster.kill(old)
                    cluster.kill(follower)
                    failover = await load.failover_time(fault)
                    await load.wait_acks_sent_after(fault, 200, 20)
                new, new_term = c.leader_member_id, c.leadership_term_id
                assert new not in (old, follower)
                assert new_term > term
                assert c.cluster_session_id == session
                assert await unreadable(kv, load.acked) == []

                # A third member goes: 2 of 5 left, no quorum, nothing is acknowledged.
                third = next(m for m in range(5) if m not in (old, follower, new))
                cluster.kill(third)
                kv.timeout = 2.0
                with pytest.raises(TimeoutError):
                    await kv.put("no-quorum", b"lost?")

                # The old leader comes back (with its log of an old term): 3 of 5,
                # progress resumes in the same session.
                restarted = trio.current_time()
                await restart(cluster, old)
                kv.timeout = None
                more = Load(kv, "five-again")
                async with running(more):
                    resumed = await more.failover_time(restarted, limit=30)
                    await more.wait_acks_sent_after(0.0, 200, 20)
                assert c.cluster_session_id == session
                assert await unreadable(kv, {**load.acked, **more.acked}) == []
                # The restarted old leader dropped whatever it had beyond the committed log
                # and holds the new leaders' log, like the other two live members.
                live = sorted(cluster.processes)
                target = len(archive_bytes(cluster, c.leader_member_id))

                def settled() -> bool:
                    logs = [archive_bytes(cluster, m) for m in live]
                    return min(map(len, logs)) >= target and common_prefix_identical(logs)

                await wait_for(settled, 20, f"the archives of members {live} to agree", 0.1)
                report(
                    "5 nodes",
                    failover_2_killed=failover,
                    resume_after_restart=resumed,
                    old_leader=old,
                    new_leader=new,
                    leader_after_restart=c.leader_member_id,
                    acked=len(load.acked) + len(more.acked),
                )
                assert failover < FAILOVER_BOUND

    with local_cluster(5, tmp_path) as cluster:
        trio.run(main, cluster)
