"""The KV example's history under faults, checked for linearizability (issue 43).

Three ``python -m cluster.node`` members run ``cluster.examples.kv:KeyValueService``.
Five sessions, each one op at a time through :class:`KeyValueClient` as an application
uses it, put unique values, compare-and-set, delete, and ``get`` (a query: linearizable,
and one read in four ``consistency="follower"``) a few keys, while the leader is killed
and started again, the leader is paused (SIGSTOP) past its heartbeat timeout and resumed,
leadership is handed over, and a follower is killed and started again; each step waits
for a number of ops completed after it (op counts, not wall time).  An op that raised
or timed out is indeterminate and its client goes on in a new session.

Checks: the history is linearizable (``tests/lincheck.py``: puts, cas, deletes and the
linearizable gets; a failure prints the smallest window that shows it); every follower
read answered a value some write could have given by then; every acknowledged put is in
every member's log and the logs agree.  ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import itertools
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import trio
from test_failover import archive_bytes, common_prefix_identical, restart, wait_for
from test_linearizable_history import (
    CLIENTS,
    KEYS,
    NODE_ARGS,
    OP_TIMEOUT,
    PACE,
    STEP_OPS,
    Recorder,
    hand_over,
    leader_of,
)

import client
from cluster.examples.kv import KeyValueClient
from cluster.local import LocalCluster
from tests.lincheck import Op, cas, check, check_follower_reads, delete, get, put

pytestmark = pytest.mark.slow

# the node settings, clients, keys and pacing are the register history test's
PAUSE = 2.5  # seconds the leader is stopped: past its heartbeat timeout (1 s)


async def one_op(
    kv: KeyValueClient, recorder: Recorder, who: str, rnd: random.Random, n: int
) -> bool:
    """One random op, recorded; False if it is indeterminate (the session is then done)."""
    key = rnd.choice(KEYS)
    dice = rnd.random()
    value = f"{who}-{n}"
    began = time.monotonic()
    op: Op
    try:
        with trio.fail_after(OP_TIMEOUT):
            if dice < 0.35:
                await kv.put(key, value.encode())
                op = put(who, key, value, began, time.monotonic())
            elif dice < 0.45:
                expected = rnd.choice([None, *(f"c{i}" for i in range(CLIENTS))])
                current = await kv.get(key)  # a cas of a value that is there, often
                old = current.decode() if current is not None and rnd.random() < 0.8 else expected
                ok = await kv.compare_and_set(
                    key, None if old is None else old.encode(), value.encode()
                )
                op = cas(who, key, old, value, ok, began, time.monotonic())
            elif dice < 0.5:
                existed = await kv.delete(key)
                op = delete(who, key, existed, began, time.monotonic())
            else:
                consistency = "follower" if dice >= 0.875 else "linearizable"
                answer = await kv.get(key, consistency=consistency)
                result = None if answer is None else answer.decode()
                op = get(who, key, result, began, time.monotonic(), consistency=consistency)
    except (Exception, trio.TooSlowError):
        if dice < 0.45:  # a put, or a cas (its expected value may be unknown): a value
            recorder.record(put(who, key, value, began, None))  # that may be written
        elif dice < 0.5:
            recorder.record(delete(who, key, None, began, None))
        return False
    recorder.record(op)
    return True


async def worker(cluster: LocalCluster, recorder: Recorder, index: int) -> None:
    rnd = random.Random(index)
    ops = itertools.count()
    for generation in itertools.count():
        if recorder.stopping:
            return
        who = f"c{index}.{generation}"
        try:
            async with (
                client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
                KeyValueClient(c) as kv,
            ):
                while not recorder.stopping:
                    if not await one_op(kv, recorder, who, rnd, next(ops)):
                        break
                    await trio.sleep(PACE)
        except client.ClusterClientError as exc:  # a connect that failed, a close
            print(f"\n[kv history] {who}: {type(exc).__name__}: {exc}")
            await trio.sleep(0.2)


async def nemesis(cluster: LocalCluster, recorder: Recorder, stopped: list[int]) -> list[str]:
    done: list[str] = []

    def mark(what: str) -> None:
        done.append(
            f"{time.monotonic() - recorder.began:5.1f} s, {len(recorder.history):5} ops: {what}"
        )

    await recorder.ops_after(STEP_OPS, "warming up")
    leader = await leader_of(cluster)
    mark(f"SIGKILL leader {leader}")
    await trio.to_thread.run_sync(cluster.kill, leader)
    await recorder.ops_after(STEP_OPS, "after the leader was killed")
    await restart(cluster, leader)
    mark(f"member {leader} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the killed leader restarted")

    leader = await leader_of(cluster)
    mark(f"SIGSTOP leader {leader} for {PAUSE:g} s")
    cluster.signal(leader, signal.SIGSTOP)
    stopped.append(leader)
    await trio.sleep(PAUSE)
    cluster.signal(leader, signal.SIGCONT)
    stopped.remove(leader)
    mark(f"SIGCONT member {leader}")
    await recorder.ops_after(STEP_OPS, "after the paused leader resumed")

    await hand_over(cluster)
    mark("leadership handed over")
    await recorder.ops_after(STEP_OPS, "after the hand-over")

    leader = await leader_of(cluster)
    follower = (leader + 1) % cluster.nodes
    mark(f"SIGKILL follower {follower}")
    await trio.to_thread.run_sync(cluster.kill, follower)
    await recorder.ops_after(STEP_OPS // 2, "after a follower was killed")
    await restart(cluster, follower)
    mark(f"member {follower} started again")
    await recorder.ops_after(STEP_OPS // 2, "after the follower restarted")
    return done


def test_kv_history_under_faults_is_linearizable(tmp_path: Path) -> None:
    cluster = LocalCluster(3, "cluster.examples.kv:KeyValueService", tmp_path, extra_args=NODE_ARGS)
    recorder = Recorder()
    stopped: list[int] = []
    finals: dict[str, bytes | None] = {}

    async def main() -> list[str]:
        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for index in range(CLIENTS):
                    nursery.start_soon(worker, cluster, recorder, index)
                steps = await nemesis(cluster, recorder, stopped)
                recorder.stopping = True
            async with (
                client.connect(cluster.ingress_endpoints, connect_timeout=30) as c,
                KeyValueClient(c) as kv,
            ):
                for key in KEYS:
                    began = time.monotonic()
                    finals[key] = value = await kv.get(key)
                    text = None if value is None else value.decode()
                    recorder.record(get("final", key, text, began, time.monotonic()))
            # every acknowledged put reaches every member's log, and the logs agree
            await wait_for(
                lambda: all(
                    all(v.encode() in archive_bytes(cluster, m) for _, v in recorder.acknowledged)
                    for m in range(cluster.nodes)
                ),
                60,
                "every acknowledged put in every member's log",
                interval=0.2,
            )
            return steps

    began = time.monotonic()
    try:
        cluster.start_all(timeout=20)
        steps = trio.run(main)
    finally:
        for member in stopped:
            cluster.signal(member, signal.SIGCONT)
        cluster.stop_all()
    wall = time.monotonic() - began
    checked = time.monotonic()
    result = check(recorder.history)
    took = time.monotonic() - checked
    kinds = Counter(
        op.kind if op.consistency == "linearizable" else "follower get" for op in recorder.history
    )
    print(
        f"\n[kv history] {len(recorder.history)} ops ({dict(kinds)}), "
        f"{recorder.indeterminate} indeterminate, in {wall:.1f} s; checked in "
        f"{took * 1000:.0f} ms: " + ("linearizable" if result.ok else "NOT linearizable")
    )
    for step in steps:
        print(f"[kv history]   {step}")
    assert result.ok, result.explain()
    assert check_follower_reads(recorder.history) == []
    for kind in ("put", "get", "cas", "delete", "follower get"):
        assert kinds[kind] > 0, kinds
    logs = [archive_bytes(cluster, member) for member in range(cluster.nodes)]
    assert common_prefix_identical(logs)
