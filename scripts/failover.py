#!/usr/bin/env python3
"""Failover drill: kill the leader of a local cluster under KV load, again and again.

Starts ``--nodes`` ``python -m cluster.node`` processes running the key-value service,
opens one client session and keeps puts of unique keys going (one started every
``1/--rate`` s, however many are still waiting).  Each round SIGKILLs the current leader,
measures the failover time (from the kill to the first acknowledgement of a put sent
after it), restarts the killed member and waits until its archive holds the leader's log
byte for byte.  At the end every acknowledged write is read back.  The session must
survive every round (same cluster session id: the client never reconnects).

    python3 scripts/failover.py --nodes 3 --heartbeat-timeout 1s --rounds 3 [--json]

Exit code 0 when every round failed over and every acknowledged write read back.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.config import ConfigError, parse_duration_ns  # noqa: E402
from cluster.examples.kv import KeyValueClient  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402

KV = "cluster.examples.kv:KeyValueService"


@dataclass
class Load:
    """Puts of unique keys at a steady rate; remembers what was acknowledged and when."""

    kv: KeyValueClient
    interval: float
    max_in_flight: int = 1000
    acked: dict[str, bytes] = field(default_factory=dict)
    acks: list[tuple[float, float]] = field(default_factory=list)  # (sent, acknowledged)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        slots = trio.Semaphore(self.max_in_flight)
        async with trio.open_nursery() as nursery:
            task_status.started()
            for i in itertools.count():
                await slots.acquire()
                nursery.start_soon(self._put, f"drill-{i}", slots)
                await trio.sleep(self.interval)

    async def _put(self, key: str, slots: trio.Semaphore) -> None:
        try:
            sent = trio.current_time()
            value = f"value-of-{key}".encode()
            await self.kv.put(key, value)
            self.acked[key] = value
            self.acks.append((sent, trio.current_time()))
        finally:
            slots.release()

    def acks_sent_after(self, moment: float) -> list[float]:
        """Acknowledgement times of the puts sent at or after ``moment``."""
        return [acked for sent, acked in self.acks if sent >= moment]

    async def wait_acks_sent_after(self, moment: float, count: int, limit: float) -> None:
        with trio.fail_after(limit):
            while len(self.acks_sent_after(moment)) < count:  # noqa: ASYNC110
                await trio.sleep(0.01)


def archive_bytes(cluster: LocalCluster, member_id: int) -> bytes:
    directory = cluster.directory / f"node-{member_id}" / "archive"
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.seg")))


async def wait_caught_up(
    cluster: LocalCluster, member_id: int, target: bytes, limit: float
) -> None:
    with trio.fail_after(limit):
        while archive_bytes(cluster, member_id)[: len(target)] != target:  # noqa: ASYNC110
            await trio.sleep(0.1)


async def unreadable(kv: KeyValueClient, expected: dict[str, bytes]) -> list[str]:
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


def say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, flush=True)


async def drill(args: argparse.Namespace, cluster: LocalCluster) -> dict[str, Any]:
    heartbeat = parse_duration_ns(args.heartbeat_timeout) / 1e9
    limit = 10 * heartbeat + 20  # for any one step
    rounds: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        for attempt in range(1, 4):
            try:
                c = await stack.enter_async_context(
                    client.connect(cluster.ingress_endpoints, connect_timeout=limit / 2)
                )
                break
            except client.ConnectTimeoutError as exc:
                # A start-up leader that steps down drops the connect requests it held.
                if attempt == 3:
                    raise
                say(args, f"connect attempt {attempt} timed out, retrying: {exc}")
        kv = await stack.enter_async_context(KeyValueClient(c))
        session = c.cluster_session_id
        load = Load(kv, interval=1.0 / args.rate)
        say(args, f"session {session}, leader {c.leader_member_id} (term {c.leadership_term_id})")
        async with trio.open_nursery() as nursery:
            await nursery.start(load.run)
            warm = trio.current_time()
            await trio.sleep(args.load_seconds)
            await load.wait_acks_sent_after(warm, 1, limit)
            for number in range(1, args.rounds + 1):
                leader, term = c.leader_member_id, c.leadership_term_id
                before = len(load.acks)
                fault = trio.current_time()
                cluster.kill(leader)
                await load.wait_acks_sent_after(fault, 1, limit)
                failover = min(load.acks_sent_after(fault)) - fault
                new_leader, new_term = c.leader_member_id, c.leadership_term_id
                started = trio.current_time()
                cluster.start(leader)
                await trio.to_thread.run_sync(partial(cluster.wait_ready, limit, [leader]))
                target = archive_bytes(cluster, new_leader)
                await wait_caught_up(cluster, leader, target, limit)
                catch_up = trio.current_time() - started
                await trio.sleep(args.load_seconds)
                result = {
                    "round": number,
                    "killed_leader": leader,
                    "term": term,
                    "new_leader": new_leader,
                    "new_term": new_term,
                    "failover_s": round(failover, 4),
                    "catch_up_s": round(catch_up, 4),
                    "caught_up_bytes": len(target),
                    "acked_in_round": len(load.acks) - before,
                    "same_session": c.cluster_session_id == session and not c.is_closed,
                }
                rounds.append(result)
                say(
                    args,
                    f"round {number}: killed leader {leader} (term {term}) -> leader "
                    f"{new_leader} (term {new_term}): failover {failover:.3f} s; member "
                    f"{leader} restarted and caught up {len(target)} bytes in {catch_up:.3f} s; "
                    f"{result['acked_in_round']} writes acknowledged this round",
                )
            nursery.cancel_scope.cancel()
        say(args, f"checking {len(load.acked)} acknowledged writes...")
        bad = await unreadable(kv, load.acked)
        same_session = c.cluster_session_id == session and not c.is_closed
    failovers = [r["failover_s"] for r in rounds]
    ok = not bad and same_session and all(r["new_leader"] != r["killed_leader"] for r in rounds)
    return {
        "nodes": args.nodes,
        "heartbeat_timeout_s": heartbeat,
        "rounds": rounds,
        "failover_s": {
            "min": min(failovers),
            "median": statistics.median(failovers),
            "max": max(failovers),
        },
        "acknowledged_writes_checked": len(load.acked),
        "unreadable_writes": len(bad),
        "unreadable_sample": bad[:10],
        "same_session": same_session,
        "ok": ok,
    }


def print_log_tails(cluster: LocalCluster, lines: int = 15) -> None:
    for member_id in range(cluster.nodes):
        path = cluster.log_dir / f"node-{member_id}.log"
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            print(f"--- {path} (last {len(tail)} lines)", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=3, choices=[3, 5])
    p.add_argument("--rounds", type=int, default=3, help="leaders to kill (default 3)")
    p.add_argument("--heartbeat-timeout", default="1s", help="leader heartbeat timeout")
    p.add_argument("--election-timeout", default="500ms", help="candidate ballot timeout")
    p.add_argument("--rate", type=float, default=200.0, help="puts started per second")
    p.add_argument(
        "--load-seconds", type=float, default=1.0, help="load before each kill (default 1)"
    )
    p.add_argument("--dir", help="data directory, kept afterwards (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print a JSON summary only")
    args = p.parse_args()
    try:
        parse_duration_ns(args.heartbeat_timeout)
        parse_duration_ns(args.election_timeout)
    except (ConfigError, ValueError) as exc:
        p.error(str(exc))
    if args.rounds < 1 or args.rate <= 0 or args.load_seconds < 0:
        p.error("--rounds and --rate must be positive, --load-seconds not negative")
    node_args = [
        "--leader-heartbeat-timeout",
        args.heartbeat_timeout,
        "--election-timeout",
        args.election_timeout,
        "--session-timeout",
        "10s",
    ]
    with tempfile.TemporaryDirectory(prefix="triarch-failover-") as tmp:
        cluster = LocalCluster(args.nodes, KV, args.dir or tmp, extra_args=node_args)
        try:
            cluster.start_all(timeout=30)
            say(
                args,
                f"{args.nodes} nodes: {cluster.ingress_endpoints}"
                + (f" (data and logs in {cluster.log_dir})" if args.dir else ""),
            )
            result = trio.run(drill, args, cluster)
        except Exception as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            print_log_tails(cluster)
            return 1
        finally:
            cluster.stop_all()
        if not result["ok"]:
            print_log_tails(cluster)
    if args.json:
        print(json.dumps(result))
    else:
        f = result["failover_s"]
        print(
            f"failover over {len(result['rounds'])} rounds: min {f['min']:.3f} s, "
            f"median {f['median']:.3f} s, max {f['max']:.3f} s\n"
            f"{result['acknowledged_writes_checked']} acknowledged writes checked: "
            + (
                "all read back"
                if not result["unreadable_writes"]
                else f"{result['unreadable_writes']} MISSING, e.g. {result['unreadable_sample']}"
            )
            + f"; one session throughout: {result['same_session']}"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
