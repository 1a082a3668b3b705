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
(``tests/lincheck.py``: the writes and linearizable reads; a failure prints the smallest
window that shows it), every follower read answered a value written by then, no
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
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from test_failover import archive_bytes, common_prefix_identical, restart, wait_for

import client
import client._ingress
from cluster.local import LocalCluster
from tests.lincheck import Op, check, check_follower_reads, check_monotonic_reads, get, put

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
STEP_OPS = 50  # ops completed after each fault before the next step
PACE = 0.005  # seconds between two ops of a client: a busy 2-core machine
STEP_LIMIT = 60.0  # seconds for them: a cluster that stops serving fails the test
ISOLATION = 1.0  # seconds the paused leader runs alone after it resumes (second pause)
PROBES = 4  # sessions kept on the paused leader, each querying every key at both levels
PATIENT = 0
"""The member paused while it leads: its own leader heartbeat timeout is long (30 s), so
it does not step down by itself on its first tick after the pause (as a member whose
timeout passed while it was stopped does): the queries it reads then are in a race only
with the new leader's messages (as in ``test_queries.py``)."""


class Cluster(LocalCluster):
    def command(self, member_id: int) -> list[str]:
        args = super().command(member_id)
        if member_id == PATIENT:
            args += ["--leader-heartbeat-timeout", "30s"]  # the last one given wins
        return args


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
    began: float = field(default_factory=time.monotonic)

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
                    await trio.sleep(PACE)
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


async def hand_over(cluster: LocalCluster, to: int | None = None) -> None:
    """``cluster-tool transfer-leadership`` (to ``to``), and wait until it leads."""
    args = ["transfer-leadership"] + ([] if to is None else ["--to", str(to)])
    moved = await trio.to_thread.run_sync(lambda: tool(cluster, *args))
    assert moved.returncode == 0, moved.stderr
    if to is not None:
        with trio.fail_after(30):
            while await leader_of(cluster) != to:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)


async def pause_round(
    cluster: LocalCluster, recorder: Recorder, stopped: list[int], round_: int, isolated: bool
) -> str:
    """PATIENT, leading, is paused; a session writes every key through the new leader;
    then probe sessions still connected to PATIENT query every key (invoked after those
    writes completed), and PATIENT is resumed: it reads the probes' queries at once, and
    must not answer them from before the writes.  Which PATIENT reads first, the queries
    or the new leader's messages, is a race; ``isolated``: the other two members are
    paused before PATIENT resumes and resumed ``ISOLATION`` seconds after, so that
    PATIENT reads the queries first, and hears from nobody (a deposed leader cut off).
    Returns what happened."""
    if await leader_of(cluster) != PATIENT:
        await hand_over(cluster, PATIENT)
    others = [m for m in range(cluster.nodes) if m != PATIENT]
    before = await counters_of(cluster, PATIENT)
    async with AsyncExitStack() as stack:
        probes = []
        for _ in range(PROBES):
            c = await stack.enter_async_context(
                client.connect(cluster.ingress_endpoints, connect_timeout=30)
            )
            await c.query(b"count")  # its session is open at the leader
            assert c.leader_member_id == PATIENT
            probes.append(c)
        cluster.signal(PATIENT, signal.SIGSTOP)
        stopped.append(PATIENT)
        async with client.connect(endpoints_without(cluster, PATIENT), connect_timeout=30) as c:
            for i, key in enumerate(KEYS):
                assert await write(c, recorder, f"side{round_}", key, f"side-{round_}-{i}")
        if isolated:
            for member in others:
                cluster.signal(member, signal.SIGSTOP)
                stopped.append(member)
        async with trio.open_nursery() as nursery:
            for i, c in enumerate(probes):
                for key in KEYS:
                    for follower in (False, True):
                        nursery.start_soon(read, c, recorder, f"probe{round_}.{i}", key, follower)
            await trio.sleep(0.2)  # the queries are written to the paused member
            on_patient = sum(c.leader_member_id == PATIENT for c in probes)
            cluster.signal(PATIENT, signal.SIGCONT)
            stopped.remove(PATIENT)
            if isolated:
                await trio.sleep(ISOLATION)
                for member in others:
                    cluster.signal(member, signal.SIGCONT)
                    stopped.remove(member)
    after = await counters_of(cluster, PATIENT)
    took = {name: after[name] - before[name] for name in ("read_rounds", "queries_refused")}
    return (
        f"member {PATIENT} paused while leading and resumed"
        + (f", alone for {ISOLATION:g} s," if isolated else ",")
        + f" {on_patient} of {PROBES} probe sessions on it; then it counted {took}"
    )


async def nemesis(cluster: LocalCluster, recorder: Recorder, stopped: list[int]) -> list[str]:
    """The faults, each followed by ``STEP_OPS`` completed ops; returns what was done."""
    done: list[str] = []

    def mark(what: str) -> None:
        done.append(f"{now() - recorder.began:5.1f} s, {len(recorder.history):5} ops: {what}")

    await recorder.ops_after(STEP_OPS, "warming up")

    # the leader killed: PATIENT (the others, with their short heartbeat timeout, elect
    # the next at once; PATIENT would refuse its vote for 30 s)
    if await leader_of(cluster) != PATIENT:
        await hand_over(cluster, PATIENT)
        mark(f"leadership handed over to member {PATIENT}")
    mark(f"SIGKILL leader {PATIENT}")
    await trio.to_thread.run_sync(cluster.kill, PATIENT)
    await recorder.ops_after(STEP_OPS, "after the leader was killed")
    await restart(cluster, PATIENT)
    mark(f"member {PATIENT} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the killed leader restarted")

    for round_, isolated in enumerate((False, True)):
        what = await pause_round(cluster, recorder, stopped, round_, isolated)
        mark(f"pause {round_ + 1}: {what}")
        await recorder.ops_after(STEP_OPS, "after the paused leader resumed")

    await hand_over(cluster)
    mark("leadership handed over")
    await recorder.ops_after(STEP_OPS, "after the hand-over")

    leader = await leader_of(cluster)
    follower = next(m for m in range(cluster.nodes) if m not in (leader, PATIENT))
    mark(f"SIGKILL follower {follower}")
    await trio.to_thread.run_sync(cluster.kill, follower)
    await recorder.ops_after(STEP_OPS // 2, "after a follower was killed")
    await restart(cluster, follower)
    mark(f"member {follower} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the follower restarted")
    return done


def with_a_stale_read(history: list[Op]) -> tuple[list[Op], Op]:
    """``history`` with its last linearizable read that began after two writes of its
    key, one completed before the other began, made to answer the older one's value."""
    puts = sorted((op for op in history if op.kind == "put" and op.ret is not None), key=done)
    for i in range(len(history) - 1, -1, -1):
        op = history[i]
        if op.kind != "get" or op.ret is None or op.consistency != "linearizable":
            continue
        before = [w for w in puts if w.key == op.key and done(w) < op.call]
        newer = before[-1] if before else None
        older = [w for w in before if newer is not None and done(w) < newer.call]
        if older and older[-1].args[0] != op.result:
            stale = get(op.client, op.key, older[-1].args[0], op.call, op.ret)
            return [*history[:i], stale, *history[i + 1 :]], stale
    raise AssertionError("no read to make stale")


def done(op: Op) -> float:
    assert op.ret is not None
    return op.ret


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
    cluster = Cluster(3, "register_service:RegisterService", tmp_path, extra_args=NODE_ARGS)
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
    assert check_follower_reads(recorder.history) == []
    stale = check_monotonic_reads(recorder.history, consistency="follower")
    assert stale == [], "\n".join(s.explain(result.origin) for s in stale)
    assert kinds["get"] > 0
    assert kinds["follower get"] > 0
    assert len(recorder.acknowledged) > STEP_OPS
    logs = [archive_bytes(cluster, member) for member in range(cluster.nodes)]
    assert common_prefix_identical(logs)  # the members' logs agree

    # the check can fail on this very history: one read made stale is caught
    history, stale_read = with_a_stale_read(recorder.history)
    broken = check(history)
    assert broken.linearizable is False
    assert any(stale_read in failure.needed for failure in broken.failures), broken.explain()
