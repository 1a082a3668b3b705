#!/usr/bin/env python3
"""The main job: a local cluster running the replicated key-value store, under load.

1. starts ``python -m cluster.local``-style node processes with
   ``cluster.examples.kv:KeyValueService``;
2. connects clients and writes ``--keys`` keys with many requests in flight, then reads
   them all back and checks them;
3. restarts the node and reads every key back again (the archive replays the log);
4. prints throughput and what it checked, then stops the cluster.

The live console (``cluster-tui``) joins this job when issue #7 lands.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.examples.kv import KeyValueClient  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402


async def write_keys(endpoints: str, keys: int, clients: int, in_flight: int) -> float:
    started = time.perf_counter()
    per_client = keys // clients

    async def worker(index: int) -> None:
        async with client.connect(endpoints) as c, KeyValueClient(c) as kv:
            limiter = trio.CapacityLimiter(in_flight)

            async def put(i: int) -> None:
                async with limiter:
                    await kv.put(f"key-{i}", f"value-{i}".encode())

            async with trio.open_nursery() as n:
                for i in range(index * per_client, (index + 1) * per_client):
                    n.start_soon(put, i)

    async with trio.open_nursery() as nursery:
        for index in range(clients):
            nursery.start_soon(worker, index)
    return time.perf_counter() - started


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
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=500, help="requests in flight per client")
    p.add_argument("--dir", help="data directory (default: a temporary one)")
    args = p.parse_args()
    keys = args.keys - args.keys % args.clients
    with tempfile.TemporaryDirectory(prefix="triarch-demo-") as tmp:
        directory = Path(args.dir or tmp)
        cluster = LocalCluster(1, "cluster.examples.kv:KeyValueService", directory)
        cluster.start_all()
        try:
            endpoints = cluster.ingress_endpoints
            print(f"cluster up: ingress {endpoints}, data in {directory}", flush=True)
            elapsed = trio.run(write_keys, endpoints, keys, args.clients, args.in_flight)
            print(
                f"wrote {keys} keys from {args.clients} clients in {elapsed:.2f}s "
                f"({keys / elapsed:,.0f} writes/s, each acknowledged after fsync)",
                flush=True,
            )
            missing, elapsed = trio.run(read_keys, endpoints, keys)
            print(
                f"read back {keys} keys in {elapsed:.2f}s: {missing} missing or wrong", flush=True
            )
            print("restarting the node (SIGTERM, then start again)...", flush=True)
            cluster.stop(0)
            started = time.perf_counter()
            cluster.start(0)
            cluster.wait_ready()
            print(
                f"node back in {time.perf_counter() - started:.2f}s "
                "(log replayed from the archive)",
                flush=True,
            )
            missing_after, elapsed = trio.run(read_keys, endpoints, keys)
            print(
                f"read back {keys} keys after the restart in {elapsed:.2f}s: "
                f"{missing_after} missing or wrong",
                flush=True,
            )
        finally:
            cluster.stop_all()
    ok = missing == 0 and missing_after == 0
    print("demo OK" if ok else "demo FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
