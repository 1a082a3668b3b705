#!/usr/bin/env python3
"""The peer benchmark: a 3-process PySyncObj cluster doing what our echo bench does.

PySyncObj has no client/server split: the application calls a ``@replicated`` method
on its local SyncObj, which forwards to the leader; the callback runs once the entry is
committed and applied.  So the fairest equivalent of "clients keeping N messages in
flight against the echo service" is what PySyncObj's own benchmark does: every member
drives load, here each keeping its share of ``--in-flight`` outstanding
``echo(payload)`` calls, and latency is call-to-callback.  Throughput is the sum over
members.  PySyncObj has no fsync: it never writes its log to disk here.

With ``--rate`` it runs open loop instead, like ``bench.py --rate``: each member calls
``echo`` at its share of the rate on a 1 ms tick, message *k* due at ``start + k / rate``,
and latency counts from the due time (no coordinated omission).

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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.local import free_ports  # noqa: E402
from cluster.metrics import Histogram  # noqa: E402

OPEN_LOOP_TICK = 0.001  # seconds between an open-loop member's wake-ups (as bench.py)
OPEN_LOOP_BATCH_ABOVE = 3000  # msg/s above which ``--batch auto`` turns batching on
# (measured: without batching PySyncObj falls behind from about 4,000 calls/s open loop)


def run_member(index: int, addresses: list[str], args: argparse.Namespace) -> int:
    """One PySyncObj member that also drives its share of the load and prints its
    counts and latency histogram as one JSON line."""
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class Echo(SyncObj):  # type: ignore[misc]
        def __init__(self) -> None:
            conf = SyncObjConf(
                dynamicMembershipChange=False,
                commandsWaitLeader=True,
                appendEntriesUseBatch=batching(args, len(addresses)),
            )
            me = addresses[index]
            partners = [a for a in addresses if a != me]
            super().__init__(me, partners, conf)

        @replicated  # type: ignore[misc, untyped-decorator, unused-ignore]
        def echo(self, payload: bytes) -> bytes:
            return payload

    node = Echo()
    deadline = time.monotonic() + 30
    while node._getLeader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    rate = args.rate / len(addresses) if args.rate else 0.0
    result = open_loop(node, args, rate) if rate else closed_loop(node, args, index, addresses)
    print(json.dumps(result), flush=True)
    time.sleep(2)  # let the other members finish before this one leaves
    node.destroy()
    return 0


def closed_loop(
    node: Any, args: argparse.Namespace, index: int, addresses: list[str]
) -> dict[str, Any]:
    """Keep this member's share of ``--in-flight`` calls outstanding; latency from call
    to callback."""
    hist = Histogram()
    lock = threading.Lock()
    # the in-flight budget split over the members (a member with none only replicates)
    window = args.in_flight // len(addresses) + (index < args.in_flight % len(addresses))
    credit = threading.Semaphore(window)
    state = {"measuring": False, "done": 0}
    payload = b"x" * args.payload

    def callback(result: object, error: object, started: int) -> None:
        now = time.perf_counter_ns()
        with lock:
            if state["measuring"] and error == 0:
                hist.record(now - started)
                state["done"] += 1
        credit.release()

    start = time.monotonic()
    stop = start + args.warmup + args.duration
    measure_at = start + args.warmup
    measured_from = 0.0
    while window and time.monotonic() < stop:
        if not state["measuring"] and time.monotonic() >= measure_at:
            with lock:
                state["measuring"] = True
            measured_from = time.monotonic()
        if not credit.acquire(timeout=1):
            continue
        started = time.perf_counter_ns()
        node.echo(payload, callback=lambda r, e, s=started: callback(r, e, s))
    if not window:
        time.sleep(max(0.0, stop - time.monotonic()))
        measured_from = measure_at
    elapsed = time.monotonic() - measured_from
    with lock:
        state["measuring"] = False
        return {"done": state["done"], "elapsed": elapsed, "histogram": hist.to_dict()}


def open_loop(node: Any, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """Call ``echo`` at ``rate`` per second, latency from each call's due time."""
    hist = Histogram()
    lock = threading.Lock()
    done = 0
    payload = b"x" * args.payload
    interval_ns = int(1e9 / rate)
    start = time.perf_counter_ns()
    measure_from = start + int(args.warmup * 1e9)
    stop = measure_from + int(args.duration * 1e9)

    def callback(result: object, error: object, due: int) -> None:
        nonlocal done
        now = time.perf_counter_ns()
        with lock:
            if due >= measure_from and error == 0:
                hist.record(now - due)
                done += 1

    sent = 0  # calls made while measuring
    next_due = start
    while (now := time.perf_counter_ns()) < stop:
        while next_due <= now:
            if next_due >= measure_from:
                sent += 1
            node.echo(payload, callback=lambda r, e, d=next_due: callback(r, e, d))
            next_due += interval_ns
        time.sleep(OPEN_LOOP_TICK)
    # wait (a bounded time) for the measured calls still in flight
    deadline = time.monotonic() + 10
    while done < sent and time.monotonic() < deadline:
        time.sleep(0.01)
    with lock:
        return {"done": done, "sent": sent, "elapsed": args.duration, "histogram": hist.to_dict()}


def batching(args: argparse.Namespace, nodes: int) -> bool:
    """PySyncObj's append batching: its throughput mode (commands wait for the next
    append period, 100 ms by default); without it every command wakes the event loop
    at once (its low-latency mode).  ``auto`` picks the better one for the load."""
    if args.batch == "auto":
        if args.rate:
            return bool(args.rate > OPEN_LOOP_BATCH_ABOVE)
        return bool(args.in_flight > nodes)
    return bool(args.batch == "on")


def combine(parts: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, object]:
    hist = Histogram()
    for part in parts:
        hist.merge(Histogram.from_dict(part["histogram"]))
    done = sum(int(part["done"]) for part in parts)
    elapsed = max(float(part["elapsed"]) for part in parts)
    extra: dict[str, object] = {}
    if args.rate:  # open loop: how many of the calls made while measuring came back
        extra["offered_messages"] = sum(int(part.get("sent", 0)) for part in parts)
    return {
        **extra,
        "system": "pysyncobj",
        "nodes": len(parts),
        "clients": len(parts),
        "in_flight": args.in_flight,
        "rate": args.rate,
        "payload_bytes": args.payload,
        "fsync": "none",
        "append_batching": batching(args, len(parts)),
        "duration_s": round(elapsed, 3),
        "committed_messages": done,
        "messages_per_s": round(done / elapsed, 1) if elapsed else 0.0,
        "payload_mb_per_s": round(done * args.payload / elapsed / 1e6, 2) if elapsed else 0.0,
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--in-flight", type=int, default=1000)
    p.add_argument("--payload", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=None, help="open loop: calls/s in total")
    p.add_argument(
        "--batch",
        choices=["auto", "on", "off"],
        default="auto",
        help="PySyncObj append batching (auto: off for at most one call in flight per member)",
    )
    p.add_argument("--member", type=int, help=argparse.SUPPRESS)
    p.add_argument("--addresses", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rate is not None and not args.rate > 0:
        p.error("--rate must be a positive number of calls per second")
    if args.member is not None:
        return run_member(args.member, args.addresses.split(","), args)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(args.nodes)]
    common = [
        "--in-flight", str(args.in_flight), "--payload", str(args.payload),
        "--duration", str(args.duration), "--warmup", str(args.warmup),
        "--batch", args.batch, "--addresses", ",".join(addresses),
        *(["--rate", str(args.rate)] if args.rate else []),
    ]  # fmt: skip
    members = [
        subprocess.Popen(
            [sys.executable, __file__, "--member", str(i), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for i in range(args.nodes)
    ]
    parts: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        for proc in members:
            out, err = proc.communicate(timeout=args.warmup + args.duration + 90)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                errors.append(err[-2000:])
            else:
                parts.append(json.loads(lines[-1]))
    finally:
        for proc in members:
            proc.kill()
            proc.wait()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    print(json.dumps(combine(parts, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
