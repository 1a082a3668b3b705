"""Follower reads with real processes (issue 43): three ``python -m cluster.node``
members running ``register_service.py``, with TLS (``--certs-dir``: the query
connections use the session's certificates).

* ``query(..., consistency="follower")`` is answered by every member in turn (each
  member's ``follower_queries`` counter grows), over query connections the client opens
  to each; nothing goes through the log.
* Read-your-writes on any member: right after a write is acknowledged, a follower read
  of it, whichever member answers, sees it (followers learn of a commit only with the
  next append or heartbeat, so without ``min_sequence`` they answer the old value).
* A client's follower reads never go back in time while another client writes (the
  register's ``count`` of applied writes never goes down from one answer to the next,
  though the answers come from members that have applied different amounts).
* A SIGSTOPped follower does not stall follower reads: they are answered elsewhere.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.lowlevel

import client
from cluster.certs import make_certs
from cluster.local import LocalCluster

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
NODE_ARGS = [
    "--leader-heartbeat-timeout",
    "2s",
    "--startup-canvass-timeout",
    "5s",
    "--election-timeout",
    "500ms",
    "--session-timeout",
    "60s",
]


def follower_queries(cluster: LocalCluster) -> dict[int, int]:
    """Each member's ``follower_queries`` counter (``cluster-tool describe --json``)."""
    assert cluster.certs is not None
    certs = ["--certs-dir", str(cluster.certs / "client-admin")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.tool",
            "--members",
            cluster.members,
            *certs,
            "describe",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    document = json.loads(done.stdout)
    return {
        member["member_id"]: member["counters"]["follower_queries"]
        for member in document["members"]
        if isinstance(member.get("counters"), dict)
    }


def test_follower_reads_with_real_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(HERE)]))
    pki = tmp_path / "pki"
    make_certs(pki, [(0, HOST), (1, HOST), (2, HOST)])
    cluster = LocalCluster(
        3, "register_service:RegisterService", tmp_path, extra_args=NODE_ARGS, certs=pki
    )
    app = pki / "client-app"
    stopped: list[int] = []

    async def main() -> None:
        async with client.connect(
            cluster.ingress_endpoints, certs_dir=app, connect_timeout=30
        ) as c:
            await c.offer(b"set x 0")
            assert await c.receive() == b"ok"

            # -- every member answers, in turn
            before = await trio.to_thread.run_sync(follower_queries, cluster)
            with trio.fail_after(30):
                for _ in range(30):
                    assert await c.query(b"get x", consistency="follower") == b"0"
            after = await trio.to_thread.run_sync(follower_queries, cluster)
            answered = {m: after[m] - before.get(m, 0) for m in after}
            print(f"\n30 follower reads, answered per member: {answered}")
            assert sorted(answered) == [0, 1, 2]
            assert all(count >= 5 for count in answered.values()), answered
            assert sum(answered.values()) >= 30

            # -- read-your-writes on whichever member answers
            with trio.fail_after(30):
                for i in range(1, 31):
                    await c.offer(b"set x %d" % i)
                    assert await c.receive() == b"ok"
                    assert await c.query(b"get x", consistency="follower") == b"%d" % i

            # -- never back in time for one client while another writes
            async with client.connect(
                cluster.ingress_endpoints, certs_dir=app, connect_timeout=30
            ) as w:
                counts: list[int] = []
                with trio.fail_after(30):
                    async with trio.open_nursery() as nursery:

                        async def write() -> None:
                            for i in range(150):
                                await w.offer(b"set y %d" % i)
                                assert await w.receive() == b"ok"
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(write)
                        while True:
                            counts.append(int(await c.query(b"count", consistency="follower")))
                            await trio.lowlevel.checkpoint()
                backwards = [(a, b) for a, b in itertools.pairwise(counts) if b < a]
                print(f"{len(counts)} follower reads during 150 writes: {counts[0]}..{counts[-1]}")
                assert not backwards, backwards[:5]
                assert counts[-1] > counts[0]

            # -- a paused member costs a retry, not a stall: reads go on elsewhere
            paused = next(m for m in range(3) if m != c.leader_member_id)
            cluster.signal(paused, signal.SIGSTOP)
            stopped.append(paused)
            times: list[float] = []
            with trio.fail_after(30):
                for _ in range(30):
                    began = trio.current_time()
                    assert await c.query(b"get x", consistency="follower") == b"30"
                    times.append(trio.current_time() - began)
            cluster.signal(paused, signal.SIGCONT)
            stopped.remove(paused)
            times.sort()
            print(
                f"member {paused} paused: 30 follower reads, median "
                f"{times[15] * 1000:.1f} ms, slowest {times[-1] * 1000:.0f} ms, "
                f"total {sum(times):.2f} s"
            )
            # at most a few of them waited for the paused member (a resend timeout each)
            assert sum(1 for t in times if t > 0.5) <= 4
            # and it answers again once resumed
            with trio.fail_after(30):
                while True:
                    before = await trio.to_thread.run_sync(follower_queries, cluster)
                    for _ in range(6):
                        assert await c.query(b"get x", consistency="follower") == b"30"
                    after = await trio.to_thread.run_sync(follower_queries, cluster)
                    if after.get(paused, 0) > before.get(paused, 0):
                        break
                    await trio.sleep(0.3)

    try:
        cluster.start_all(timeout=20)
        trio.run(main)
    finally:
        for member in stopped:
            cluster.signal(member, signal.SIGCONT)
        cluster.stop_all()
