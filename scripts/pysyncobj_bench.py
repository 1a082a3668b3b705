#!/usr/bin/env python3
"""The peer benchmark: a 3-process PySyncObj cluster doing what our echo bench does.

PySyncObj has no client/server split: the application calls a ``@replicated`` method
on its local SyncObj, which forwards to the leader; the callback runs once the entry is
committed and applied.  So the fairest equivalent of "clients keeping N messages in
flight against the echo service" is: one process drives ``--in-flight`` outstanding
``echo(payload)`` calls on its SyncObj (the other two are plain members), and latency is
call-to-callback.  PySyncObj has no fsync: it never writes its log to disk here.

Run by ``scripts/bench.py --vs-pysyncobj`` (which installs PySyncObj if needed); it
prints one JSON line with the same fields as ours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.local import free_ports  # noqa: E402
from cluster.metrics import Histogram  # noqa: E402


def run_member(index: int, addresses: list[str], args: argparse.Namespace) -> int:
    from pysyncobj import SyncObj, SyncObjConf, replicated  # type: ignore[import-not-found]

    class Echo(SyncObj):  # type: ignore[misc]
        def __init__(self) -> None:
            conf = SyncObjConf(dynamicMembershipChange=False, commandsWaitLeader=True)
            me = addresses[index]
            partners = [a for a in addresses if a != me]
            super().__init__(me, partners, conf)

        @replicated  # type: ignore[misc]
        def echo(self, payload: bytes) -> bytes:
            return payload

    node = Echo()
    deadline = time.monotonic() + 30
    while node._getLeader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if index != 0:
        time.sleep(args.warmup + args.duration + 10)
        return 0
    hist = Histogram()
    lock = threading.Lock()
    credit = threading.Semaphore(args.in_flight)
    state = {"measuring": False, "done": 0}
    payload = b"x" * args.payload

    def callback(result: object, error: object, started: int) -> None:
        now = time.perf_counter_ns()
        with lock:
            if state["measuring"] and error == 0:
                hist.record(now - started)
                state["done"] += 1
        credit.release()

    stop = time.monotonic() + args.warmup + args.duration
    measure_at = time.monotonic() + args.warmup
    measured_from = 0.0
    while time.monotonic() < stop:
        if not state["measuring"] and time.monotonic() >= measure_at:
            with lock:
                state["measuring"] = True
            measured_from = time.monotonic()
        if not credit.acquire(timeout=1):
            continue
        started = time.perf_counter_ns()
        node.echo(payload, callback=lambda r, e, s=started: callback(r, e, s))
    elapsed = time.monotonic() - measured_from
    with lock:
        state["measuring"] = False
        done = state["done"]
    result = {
        "system": "pysyncobj",
        "nodes": len(addresses),
        "in_flight": args.in_flight,
        "payload_bytes": args.payload,
        "fsync": "none",
        "duration_s": round(elapsed, 3),
        "committed_messages": done,
        "messages_per_s": round(done / elapsed, 1) if elapsed else 0.0,
        "latency_us": {
            "p50": hist.percentile(50) / 1e3,
            "p90": hist.percentile(90) / 1e3,
            "p99": hist.percentile(99) / 1e3,
            "p999": hist.percentile(99.9) / 1e3,
            "max": hist.max / 1e3,
            "mean": round(hist.mean / 1e3, 1),
            "samples": hist.count,
        },
        "distribution_us": [(p, v / 1e3) for p, v in hist.distribution()],
    }
    print(json.dumps(result), flush=True)
    node.destroy()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=1000)
    p.add_argument("--payload", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--member", type=int, help=argparse.SUPPRESS)
    p.add_argument("--addresses", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.member is not None:
        return run_member(args.member, args.addresses.split(","), args)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(args.nodes)]
    common = [
        "--in-flight", str(args.in_flight), "--payload", str(args.payload),
        "--duration", str(args.duration), "--warmup", str(args.warmup),
        "--addresses", ",".join(addresses),
    ]  # fmt: skip
    others = [
        subprocess.Popen(
            [sys.executable, __file__, "--member", str(i), *common],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(1, args.nodes)
    ]
    try:
        driver = subprocess.run(
            [sys.executable, __file__, "--member", "0", *common],
            capture_output=True,
            text=True,
            timeout=args.warmup + args.duration + 90,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    lines = [line for line in driver.stdout.splitlines() if line.startswith("{")]
    if driver.returncode != 0 or not lines:
        print(driver.stderr[-2000:], file=sys.stderr)
        return 1
    print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
