"""Exactly once in across leader changes, with real processes (issue 42).

Four sessions of the real client each call plain ``offer()`` 100 times a second into a
non-idempotent service that counts (``counting_service.py``), while the leader of the
moment is stopped with SIGTERM (a clean hand-over), moved with ``cluster-tool
transfer-leadership``, killed with SIGKILL and paused (SIGSTOP) for 3 s.  No application
code resends anything.  Afterwards every session's messages were applied exactly once
and in order (the service counts twice / out of order / how many), and the longest time
without an applied message (an echo back) after each fault is printed (``pytest -s``)
and bounded for the hand-overs.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest
import trio
from counting_service import NUMBER
from test_handover import tool

import client
from cluster.local import LocalCluster

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
    "20s",
]
SESSIONS = 4
RATE = 100.0  # offers per second per session
HANDOVER_GAP_BOUND = 1.5  # seconds without an applied message after a hand-over, at most


class Sender:
    """One session offering numbered messages at RATE; the echoes are its applied ones."""

    def __init__(self, c: client.ClusterClient) -> None:
        self.c = c
        self.sent = 0
        self.echo_times: list[float] = []
        self.stopped = trio.Event()

    async def offer_loop(self) -> None:
        next_at = trio.current_time()
        while not self.stopped.is_set():
            self.sent += 1
            await self.c.offer(NUMBER.pack(self.sent))
            next_at += 1 / RATE
            await trio.sleep_until(next_at)

    async def receive_loop(self, reports: trio.MemorySendChannel[dict[str, int]]) -> None:
        while True:
            payload = await self.c.receive()
            if len(payload) != NUMBER.size:  # the report
                await reports.send(json.loads(payload))
            else:
                self.echo_times.append(trio.current_time())


def longest_gap(times: list[float], start: float, span: float = 8.0) -> float:
    """The longest wait for the next echo, of any session, after ``start``."""
    window = sorted(t for t in times if start - 0.5 <= t <= start + span)
    before = [t for t in window if t <= start]
    after = [t for t in window if t > start]
    points = ([before[-1]] if before else [start]) + after
    return max((b - a for a, b in itertools.pairwise(points)), default=span)


def test_plain_offers_are_applied_exactly_once_through_every_kind_of_leader_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = HERE.parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(HERE)]))
    cluster = LocalCluster(3, "counting_service:CountingService", tmp_path, extra_args=NODE_ARGS)
    gaps: dict[str, float] = {}

    async def leader(c: client.ClusterClient) -> int:
        return c.leader_member_id

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            clients = []
            for _ in range(SESSIONS):
                c = await nursery.start(_session, cluster.ingress_endpoints)
                clients.append(c)
            senders = [Sender(c) for c in clients]
            reports_in, reports_out = trio.open_memory_channel[dict[str, int]](SESSIONS)
            for s in senders:
                nursery.start_soon(s.offer_loop)
                nursery.start_soon(s.receive_loop, reports_in)
            await trio.sleep(2)
            times = lambda: [t for s in senders for t in s.echo_times]  # noqa: E731

            # 1. SIGTERM of the leader: a clean hand-over
            old = await leader(clients[0])
            fault = trio.current_time()
            cluster.signal(old, signal.SIGTERM)
            await trio.sleep(5)
            gaps["SIGTERM"] = longest_gap(times(), fault)
            await trio.to_thread.run_sync(lambda: cluster.processes[old].wait(30))
            cluster.start(old)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(30, member_ids=[old]))
            await trio.sleep(2)

            # 2. transfer-leadership
            fault = trio.current_time()
            done = await trio.to_thread.run_sync(lambda: tool(cluster, "transfer-leadership"))
            assert done.returncode == 0, done.stderr
            await trio.sleep(5)
            gaps["transfer-leadership"] = longest_gap(times(), fault)

            # 3. SIGKILL of the leader
            old = await leader(clients[0])
            fault = trio.current_time()
            cluster.kill(old)
            await trio.sleep(6)
            gaps["SIGKILL"] = longest_gap(times(), fault)
            cluster.start(old)
            await trio.to_thread.run_sync(lambda: cluster.wait_ready(30, member_ids=[old]))
            await trio.sleep(2)

            # 4. SIGSTOP of the leader for 3 s
            old = await leader(clients[0])
            fault = trio.current_time()
            cluster.signal(old, signal.SIGSTOP)
            await trio.sleep(3)
            cluster.signal(old, signal.SIGCONT)
            await trio.sleep(4)
            gaps["SIGSTOP 3 s"] = longest_gap(times(), fault)

            for s in senders:
                s.stopped.set()
            with trio.fail_after(60):  # everything offered is confirmed applied
                while any(c.confirmed_sequence < c.last_sequence for c in clients):  # noqa: ASYNC110
                    await trio.sleep(0.1)
            for c in clients:
                await c.offer(b"report")
            results = []
            with trio.fail_after(30):
                for _ in clients:
                    results.append(await reports_out.receive())
            nursery.cancel_scope.cancel()
        sent = sum(s.sent for s in senders)
        applied = sum(r["applied"] for r in results)
        twice = sum(r["twice"] for r in results)
        out_of_order = sum(r["out_of_order"] for r in results)
        lost = sent - sum(r["last"] for r in results) + out_of_order  # numbers never applied
        print(
            f"\nexactly once, {SESSIONS} sessions x {RATE:g}/s, plain offer(): sent {sent}, "
            f"applied {applied}, lost {lost}, twice {twice}, out of order {out_of_order}"
        )
        for kind, gap in gaps.items():
            print(f"  longest time without an applied message after {kind}: {gap * 1000:.0f} ms")
        assert (lost, twice, out_of_order) == (0, 0, 0)
        assert applied == sent
        assert sorted(r["last"] for r in results) == sorted(s.sent for s in senders)
        assert gaps["SIGTERM"] < HANDOVER_GAP_BOUND
        assert gaps["transfer-leadership"] < HANDOVER_GAP_BOUND

    async def _session(
        endpoints: str, *, task_status: trio.TaskStatus[client.ClusterClient]
    ) -> None:
        async with client.connect(endpoints, connect_timeout=30) as c:
            task_status.started(c)
            await trio.sleep_forever()

    cluster.start_all(timeout=30)
    try:
        trio.run(main)
    finally:
        for proc in cluster.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        cluster.stop_all()
