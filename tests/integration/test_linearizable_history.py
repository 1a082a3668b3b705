"""A history of writes and queries under faults, checked for linearizability (issue 43).

Three ``python -m cluster.node`` members run ``register_service.py``.  Several client
sessions, each one op at a time, write unique values to a few keys (``set KEY VALUE``
through the log: ``offer`` and its ``ok`` reply) and read them with queries
(``get KEY``, ``consistency="linearizable"``, and ``at KEY``, ``consistency="follower"``,
whose answer carries the log position it reflects).  Every op is recorded with monotonic
invocation and completion times; one that raised or timed out is indeterminate (it may
or may not have taken effect) and its client goes on in a new session, as a Jepsen
process does.  Meanwhile, each step waiting for a number of ops completed after it (the
work is bounded by op counts, not wall time):

1. the leader is killed (SIGKILL) and started again;
2. the leader is paused (SIGSTOP) while another session writes every key through the new
   leader, then resumed (SIGCONT): the sessions stay connected to it through the pause
   (``LEADER_SILENCE`` is long), so their queries are the first thing it reads when it
   resumes: a read path that answered them without a read round would answer from
   before those writes;
3. leadership is handed over (``cluster-tool transfer-leadership``);
4. a follower is killed and started again.

Then a last linearizable read of every key, and the checks: the history is linearizable
(``tests/lincheck.py``; a failure prints the smallest window that shows it), no
client's follower reads went back in log position, and every acknowledged write is in the
log of every member once they have caught up.  ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from test_failover import archive_bytes, common_prefix_identical, restart, wait_for

import client
import client._ingress
from cluster.local import LocalCluster
from tests.lincheck import Op, check, check_monotonic_reads, get, put

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    "1s",
    "--startup-canvass-timeout",
    "5s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "30s",
]
CLIENTS = 5
KEYS = ("a", "b", "c")
OP_TIMEOUT = 15.0  # seconds before an op is given up as indeterminate
STEP_OPS = 80  # ops completed after each fault before the next step
STEP_LIMIT = 60.0  # seconds for them: a cluster that stops serving fails the test
PAUSE_WRITES = 2 * len(KEYS)  # writes through the new leader while the old one is paused


@dataclass
class Recorder:
    """The history, and what the nemesis waits on."""

    history: list[Op] = field(default_factory=list)
    completed: int = 0
    indeterminate: int = 0
    stopping: bool = False
    acknowledged: list[tuple[str, str]] = field(default_factory=list)  # (key, value)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    waiting: list[tuple[int, trio.Event]] = field(default_factory=list)

    def record(self, op: Op) -> None:
        self.history.append(op)
        if op.ret is None:
            self.indeterminate += 1
            return
        self.completed += 1
        for target, event in self.waiting:
            if self.completed >= target:
                event.set()
        kind = op.kind if op.consistency == "linearizable" else "follower get"
        self.latencies.setdefault(kind, []).append(op.ret - op.call)
        if op.kind == "put":
            self.acknowledged.append((op.key, op.args[0]))

    async def ops_after(self, count: int, what: str) -> None:
        """Wait until ``count`` more ops completed (the cluster serves again)."""
        target = self.completed + count
        reached = trio.Event()
        self.waiting.append((target, reached))
        with trio.move_on_after(STEP_LIMIT):
            await reached.wait()
            return
        raise AssertionError(
            f"{what}: only {self.completed - target + count} of {count} ops completed "
            f"in {STEP_LIMIT:g} s"
        )


def now() -> float:
    return time.monotonic()


async def write(
    c: client.ClusterClient, recorder: Recorder, who: str, key: str, value: str
) -> bool:
    """One write, recorded; False if it is indeterminate (the session is then done)."""
    began = now()
    try:
        with trio.fail_after(OP_TIMEOUT):
            await c.offer(f"set {key} {value}".encode())
            reply = await c.receive()
    except (Exception, trio.TooSlowError):
        recorder.record(put(who, key, value, began, None))
        return False
    assert reply == b"ok", reply  # one op at a time: the reply is this write's
    recorder.record(put(who, key, value, began, now()))
    return True


async def read(
    c: client.ClusterClient, recorder: Recorder, who: str, key: str, follower: bool
) -> bool:
    """One query, recorded; False if it failed (a read that never completed tells
    nothing; the session is given up all the same)."""
    began = now()
    try:
        with trio.fail_after(OP_TIMEOUT):
            if follower:
                answer = await c.query(f"at {key}".encode(), consistency="follower")
            else:
                answer = await c.query(f"get {key}".encode())
    except (Exception, trio.TooSlowError):
        recorder.record(get(who, key, None, began, None))
        return False
    done = now()
    position = None
    if follower:
        where, _, text = answer.decode().partition(" ")
        position = int(where)
    else:
        text = answer.decode()
    recorder.record(
        get(
            who,
            key,
            text or None,
            began,
            done,
            position=position,
            consistency="follower" if follower else "linearizable",
        )
    )
    return True


async def worker(cluster: LocalCluster, recorder: Recorder, index: int) -> None:
    """One client: a session doing one op at a time, a new one after a failed op."""
    rnd = random.Random(index)
    values = itertools.count()
    for generation in itertools.count():
        if recorder.stopping:
            return
        who = f"c{index}.{generation}"
        try:
            async with client.connect(cluster.ingress_endpoints, connect_timeout=30) as c:
                while not recorder.stopping:
                    key = rnd.choice(KEYS)
                    dice = rnd.random()
                    if dice < 0.4:
                        ok = await write(c, recorder, who, key, f"{index}-{next(values):05d}")
                    else:
                        ok = await read(c, recorder, who, key, follower=dice >= 0.8)
                    if not ok:
                        break
        except client.ClusterClientError as exc:  # a connect that failed, a close
            print(f"\n[history] {who}: {type(exc).__name__}: {exc}")
            await trio.sleep(0.2)


def tool(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def leader_of(cluster: LocalCluster) -> int:
    """The member that leads, as ``cluster-tool describe`` says (waiting for one)."""
    with trio.move_on_after(30):
        while True:
            done = await trio.to_thread.run_sync(lambda: tool(cluster, "describe", "--json"))
            if done.returncode == 0:
                leader = json.loads(done.stdout).get("leader_member_id", -1)
                if isinstance(leader, int) and leader >= 0:
                    return leader
            await trio.sleep(0.2)
    raise AssertionError("no leader known after 30 s")


async def counters_of(cluster: LocalCluster, member_id: int) -> dict[str, int]:
    """``cluster-tool describe --json``'s counters of one member."""
    done = await trio.to_thread.run_sync(lambda: tool(cluster, "describe", "--json"))
    assert done.returncode == 0, done.stderr
    for member in json.loads(done.stdout)["members"]:
        if member.get("member_id") == member_id:
            counters: dict[str, int] = member["counters"]
            return counters
    raise AssertionError(f"member {member_id} not described: {done.stdout}")


def endpoints_without(cluster: LocalCluster, member_id: int) -> str:
    return ",".join(
        part
        for part in cluster.ingress_endpoints.split(",")
        if part.partition("=")[0] != str(member_id)
    )


async def nemesis(cluster: LocalCluster, recorder: Recorder, stopped: list[int]) -> list[str]:
    """The faults, each followed by ``STEP_OPS`` completed ops; returns what was done."""
    done: list[str] = []

    def mark(what: str) -> None:
        done.append(f"{len(recorder.history)} ops: {what}")

    await recorder.ops_after(STEP_OPS, "warming up")

    leader = await leader_of(cluster)
    mark(f"SIGKILL leader {leader}")
    await trio.to_thread.run_sync(cluster.kill, leader)
    await recorder.ops_after(STEP_OPS, "after the leader was killed")
    await restart(cluster, leader)
    mark(f"member {leader} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the killed leader restarted")

    leader = await leader_of(cluster)
    before = await counters_of(cluster, leader)
    mark(f"SIGSTOP leader {leader}")
    cluster.signal(leader, signal.SIGSTOP)
    stopped.append(leader)
    async with client.connect(endpoints_without(cluster, leader), connect_timeout=30) as side:
        for i in range(PAUSE_WRITES):
            key = KEYS[i % len(KEYS)]
            assert await write(side, recorder, "paused-side", key, f"side-{i:05d}")
    cluster.signal(leader, signal.SIGCONT)
    stopped.remove(leader)
    mark(f"SIGCONT member {leader} ({PAUSE_WRITES} writes through the new leader meanwhile)")
    await recorder.ops_after(STEP_OPS, "after the paused leader resumed")
    after = await counters_of(cluster, leader)
    took = {name: after[name] - before[name] for name in ("queries", "queries_refused")}
    mark(f"member {leader} since its pause: {took}")

    moved = await trio.to_thread.run_sync(lambda: tool(cluster, "transfer-leadership"))
    assert moved.returncode == 0, moved.stderr
    mark("leadership handed over")
    await recorder.ops_after(STEP_OPS, "after the hand-over")

    leader = await leader_of(cluster)
    follower = next(m for m in range(cluster.nodes) if m != leader)
    mark(f"SIGKILL follower {follower}")
    await trio.to_thread.run_sync(cluster.kill, follower)
    await recorder.ops_after(STEP_OPS // 2, "after a follower was killed")
    await restart(cluster, follower)
    mark(f"member {follower} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the follower restarted")
    return done


def log_holds(
    cluster: LocalCluster, member_id: int, acknowledged: list[tuple[str, str]]
) -> list[str]:
    """The acknowledged writes missing from ``member_id``'s log."""
    data = archive_bytes(cluster, member_id)
    return [f"{k}={v}" for k, v in acknowledged if f"set {k} {v}".encode() not in data]


def test_history_of_writes_and_queries_under_faults_is_linearizable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parents[1]), str(HERE)]))
    # sessions stay connected to a paused leader through the pause (step 2)
    monkeypatch.setattr(client._ingress, "LEADER_SILENCE", 30.0)
    cluster = LocalCluster(3, "register_service:RegisterService", tmp_path, extra_args=NODE_ARGS)
    recorder = Recorder()
    stopped: list[int] = []
    began = now()

    async def main() -> list[str]:
        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for index in range(CLIENTS):
                    nursery.start_soon(worker, cluster, recorder, index)
                steps = await nemesis(cluster, recorder, stopped)
                recorder.stopping = True  # each worker ends after its op in flight
            async with client.connect(cluster.ingress_endpoints, connect_timeout=30) as c:
                for key in KEYS:
                    assert await read(c, recorder, "final", key, follower=False)
            # every acknowledged write reaches every member's log
            await wait_for(
                lambda: all(
                    not log_holds(cluster, m, recorder.acknowledged) for m in range(cluster.nodes)
                ),
                60,
                "every acknowledged write in every member's log",
                interval=0.2,
            )
            return steps

    try:
        cluster.start_all(timeout=20)
        steps = trio.run(main)
    finally:
        for member in stopped:
            cluster.signal(member, signal.SIGCONT)
        cluster.stop_all()

    wall = now() - began
    checked = now()
    result = check(recorder.history)
    took = now() - checked
    kinds = Counter(
        op.kind if op.consistency == "linearizable" else "follower get" for op in recorder.history
    )
    print(
        f"\n[history] {len(recorder.history)} ops ({dict(kinds)}), "
        f"{recorder.indeterminate} indeterminate, in {wall:.1f} s; checked in "
        f"{took * 1000:.0f} ms ({result.steps} steps): "
        + ("linearizable" if result.ok else "NOT linearizable")
    )
    for step in steps:
        print(f"[history]   {step}")
    for kind, times in sorted(recorder.latencies.items()):
        times.sort()
        print(
            f"[history]   {kind}: {len(times)}, median {times[len(times) // 2] * 1000:.1f} ms, "
            f"slowest {times[-1] * 1000:.0f} ms"
        )
    assert result.ok, result.explain()
    stale = check_monotonic_reads(recorder.history, consistency="follower")
    assert stale == [], "\n".join(s.explain(result.origin) for s in stale)
    assert kinds["get"] > 0
    assert kinds["follower get"] > 0
    assert len(recorder.acknowledged) > STEP_OPS
    logs = [archive_bytes(cluster, member) for member in range(cluster.nodes)]
    assert common_prefix_identical(logs)  # the members' logs agree
