#!/usr/bin/env python3
"""The main job: a local cluster running the replicated key-value store, under load.

1. starts ``--nodes`` (3) ``python -m cluster.node`` processes with
   ``cluster.examples.kv:KeyValueService``;
2. connects clients and writes ``--keys`` keys with many requests in flight, then reads
   them all back and checks them;
3. kills the leader with SIGKILL while a client keeps writing: a new leader is elected,
   the client follows it on its own, and the failover time is printed;
4. restarts the killed member (it catches up from the leader), then restarts the whole
   cluster and reads every key back again (each member replays its archive);
5. prints throughput and what it checked;
6. run in a terminal, opens the live console (``cluster-tui``) on the cluster under a
   light load until you press ``q`` (``--no-console`` skips it); then stops the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.examples.kv import KeyValueClient  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402


async def write_keys(
    endpoints: str, keys: int, clients: int, in_flight: int, first: int = 0
) -> float:
    started = time.perf_counter()
    per_client = keys // clients

    async def worker(index: int) -> None:
        async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
            limiter = trio.CapacityLimiter(in_flight)

            async def put(i: int) -> None:
                async with limiter:
                    await kv.put(f"key-{i}", f"value-{i}".encode())

            async with trio.open_nursery() as n:
                for i in range(first + index * per_client, first + (index + 1) * per_client):
                    n.start_soon(put, i)

    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(worker, index)
    return time.perf_counter() - started


async def leader_of(endpoints: str) -> int:
    async with client.connect(endpoints) as c:
        return c.leader_member_id


async def write_through_failover(
    endpoints: str, cluster: LocalCluster, first_key: int, count: int
) -> tuple[float, int, int, int]:
    """Write keys one by one; SIGKILL the leader a quarter of the way through.

    Returns (failover seconds, old leader, new leader, session id changes)."""
    async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
        session = c.cluster_session_id
        old_leader = c.leader_member_id
        killed_at = failover = 0.0
        for i in range(first_key, first_key + count):
            if i == first_key + count // 4:
                cluster.kill(old_leader)
                killed_at = time.perf_counter()
            await kv.put(f"key-{i}", f"value-{i}".encode())
            if killed_at and not failover:
                failover = time.perf_counter() - killed_at
        return failover, old_leader, c.leader_member_id, int(c.cluster_session_id != session)


async def read_keys(endpoints: str, keys: int) -> tuple[int, float]:
    started = time.perf_counter()
    missing = 0
    async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
        limiter = trio.CapacityLimiter(500)

        async def get(i: int) -> None:
            nonlocal missing
            async with limiter:
                if await kv.get(f"key-{i}") != f"value-{i}".encode():
                    missing += 1

        async with trio.open_nursery() as n:
            for i in range(keys):
                n.start_soon(get, i)
    return missing, time.perf_counter() - started


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5])
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=500, help="requests in flight per client")
    p.add_argument("--dir", help="data directory (default: a temporary one)")
    p.add_argument(
        "--no-console",
        dest="console",
        action="store_false",
        help="do not open the live console (cluster-tui) at the end",
    )
    args = p.parse_args()
    keys = args.keys - args.keys % args.clients
    more = 2_000
    total = keys + more
    with tempfile.TemporaryDirectory(prefix="triarch-demo-") as tmp:
        directory = Path(args.dir or tmp)
        cluster = LocalCluster(
            args.nodes,
            "cluster.examples.kv:KeyValueService",
            directory,
            extra_args=["--leader-heartbeat-timeout", "1s"],
        )
        cluster.start_all()
        try:
            endpoints = cluster.ingress_endpoints
            say(f"{args.nodes}-member cluster up: ingress {endpoints}, data in {directory}")
            elapsed = trio.run(write_keys, endpoints, keys, args.clients, args.in_flight)
            say(
                f"wrote {keys} keys from {args.clients} clients in {elapsed:.2f}s "
                f"({keys / elapsed:,.0f} writes/s, each acknowledged once a quorum "
                "had it on disk)"
            )
            missing, elapsed = trio.run(read_keys, endpoints, keys)
            say(f"read back {keys} keys in {elapsed:.2f}s: {missing} missing or wrong")
            if args.nodes > 1:
                failover, old, new, reconnects = trio.run(
                    write_through_failover, endpoints, cluster, keys, more
                )
                say(
                    f"killed leader {old} (SIGKILL) while writing {more} more keys: member "
                    f"{new} took over, first write acknowledged {failover:.2f}s after the "
                    f"kill; the client kept its session ({reconnects} reconnects)"
                )
                cluster.start(old)
                cluster.wait_ready(member_ids=[old])
                say(
                    f"member {old} restarted; it replays its archive and catches up from the leader"
                )
            else:
                trio.run(write_keys, endpoints, more, 1, args.in_flight, keys)
            say("restarting every member (SIGTERM, then start again)...")
            cluster.stop_all()
            started = time.perf_counter()
            cluster.start_all()
            say(f"cluster back in {time.perf_counter() - started:.2f}s (archives replayed)")
            missing_after, elapsed = trio.run(read_keys, endpoints, total)
            say(
                f"read back all {total} keys after the restart in {elapsed:.2f}s: "
                f"{missing_after} missing or wrong"
            )
            if args.console and sys.stdin.isatty() and sys.stdout.isatty():
                run_console(cluster)
            else:
                say(
                    "(the live console, cluster-tui, opens here when run in a terminal; "
                    "--no-console skips it)"
                )
        finally:
            cluster.stop_all()
    ok = missing == 0 and missing_after == 0
    say("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


def run_console(cluster: LocalCluster) -> None:
    """Keep a light KV load running and open cluster-tui on the cluster until `q`."""
    stop = threading.Event()

    async def load() -> None:
        async with client.connect(cluster.ingress_endpoints) as c, KeyValueClient(c) as kv:
            i = 0
            while not stop.is_set():
                await kv.put(f"live-{i % 1000}", str(i).encode())
                i += 1
                await trio.sleep(0.002)

    def load_thread() -> None:
        with contextlib.suppress(Exception):
            trio.run(load)

    thread = threading.Thread(target=load_thread, daemon=True)
    thread.start()
    say("opening the console: s = snapshot, p/r = suspend/resume, q = quit")
    try:
        subprocess.call([sys.executable, "-m", "tui", "--members", cluster.members])
    finally:
        stop.set()
        thread.join(timeout=5)


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
