#!/usr/bin/env python3
"""Paced probe: sessions that each send at their own steady pace, one message at a time on
a precise timer, and time every reply from the moment its message was really sent.

A closed loop (``bench.py --in-flight 1``) hides stalls: while the cluster stalls, its one
message waits and no other is sent, so a 20 ms stall costs one sample (coordinated
omission).  A paced sender keeps sending through the stall, so every message caught in it
shows, and the tail (p99, p999, max) tells how often the cluster stops and for how long.
The probe also reports how late its own sends were against their schedule: if the probe
process itself stalls, that shows there and not as cluster latency.

    python3 scripts/probe.py --nodes 3 --rate 1000 --duration 10
    python3 scripts/probe.py --endpoints 0=127.0.0.1:9010 --sessions 5 --rate 48500 --json

Latency counts from the real send (``offer`` called); it is also reported from the
scheduled time, as the bench's open loop (``bench.py --rate``) counts it, which adds the
probe's own lateness.  The two tools agree on the latter at a rate the cluster keeps up
with (tests/integration/test_bench.py checks it).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import PreciseTimer  # noqa: E402

import client  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402
from cluster.metrics import Histogram  # noqa: E402

PACKET = struct.Struct("<qqq")  # sequence, real send time, due time (perf_counter_ns)


class Probe:
    def __init__(self) -> None:
        self.latency = Histogram()
        self.scheduled = Histogram()  # from the time each message was due
        self.lateness = Histogram()
        self.sent = 0
        self.received = 0
        self.measuring = False


async def paced_session(
    endpoints: str, probe: Probe, rate: float, payload: int, stop: trio.Event
) -> None:
    padding = b"x" * max(0, payload - PACKET.size)
    interval = 1.0 / rate
    timer = PreciseTimer()
    async with client.connect(endpoints, connect_timeout=10) as c:

        async def receiver() -> None:
            unpack = PACKET.unpack_from
            while True:
                replies = await c.receive_many()
                now = time.perf_counter_ns()
                probe.received += len(replies)
                if probe.measuring:
                    stamps = [unpack(r) for r in replies]
                    probe.latency.record_all([now - sent for _, sent, _ in stamps])
                    probe.scheduled.record_all([now - due for _, _, due in stamps])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            due = time.perf_counter()
            seq = 0
            try:
                while not stop.is_set():
                    await timer.sleep_until(due)
                    sent = time.perf_counter_ns()
                    if probe.measuring:
                        probe.lateness.record(max(0, sent - int(due * 1e9)))
                    seq += 1
                    await c.offer(PACKET.pack(seq, sent, int(due * 1e9)) + padding)
                    probe.sent += 1
                    due += interval
                    if due < time.perf_counter() - 1.0:  # more than 1 s behind: skip ahead
                        due = time.perf_counter()
                with trio.move_on_after(5):
                    while probe.received < probe.sent:  # noqa: ASYNC110
                        await trio.sleep(0.01)
            finally:
                timer.close()
                nursery.cancel_scope.cancel()


def summary(h: Histogram) -> dict[str, float]:
    return {
        "count": h.count,
        "p50": h.percentile(50) / 1e3,
        "p90": h.percentile(90) / 1e3,
        "p99": h.percentile(99) / 1e3,
        "p999": h.percentile(99.9) / 1e3,
        "max": h.max / 1e3,
        "mean": round(h.mean / 1e3, 1),
    }


async def run_probe(args: argparse.Namespace, endpoints: str) -> dict[str, Any]:
    probe = Probe()
    stop = trio.Event()
    per_session = args.rate / args.sessions
    async with trio.open_nursery() as nursery:
        for _ in range(args.sessions):
            nursery.start_soon(paced_session, endpoints, probe, per_session, args.payload, stop)
        await trio.sleep(args.warmup)
        probe.measuring = True
        began, sent_before = time.perf_counter(), probe.sent
        await trio.sleep(args.duration)
        probe.measuring = False
        elapsed, sent = time.perf_counter() - began, probe.sent - sent_before
        stop.set()
    return {
        "system": "triarch",
        "mode": "paced probe",
        "nodes": args.nodes if not args.endpoints else None,
        "sessions": args.sessions,
        "rate": args.rate,
        "achieved_rate": round(sent / elapsed, 1),
        "payload_bytes": args.payload,
        "duration_s": args.duration,
        "latency_us": summary(probe.latency),
        "distribution_us": [(q, v / 1e3) for q, v in probe.latency.distribution()],
        "latency_from_schedule_us": summary(probe.scheduled),
        "send_lateness_us": summary(probe.lateness),
    }


def print_text(r: dict[str, Any]) -> None:
    lat, late, due = r["latency_us"], r["send_lateness_us"], r["latency_from_schedule_us"]

    def ms(v: float) -> str:
        return f"{v / 1e3:.2f}"

    print(
        f"paced probe: {r['sessions']} session(s) at {r['rate']:,.0f} msg/s in total "
        f"(sent {r['achieved_rate']:,.0f}/s), {r['payload_bytes']} B, {r['duration_s']} s\n"
        f"  latency from the real send, ms: p50 {ms(lat['p50'])}  p90 {ms(lat['p90'])}  "
        f"p99 {ms(lat['p99'])}  p999 {ms(lat['p999'])}  max {ms(lat['max'])}  "
        f"({lat['count']:,} replies)\n"
        f"  the probe's own sends, late by ms: p99 {ms(late['p99'])}  max {ms(late['max'])}\n"
        f"  from the scheduled time (as bench.py --rate counts), ms: p50 {ms(due['p50'])}  "
        f"p99 {ms(due['p99'])}  max {ms(due['max'])}"
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5])
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--rate", type=float, default=1000.0, help="messages/s, all sessions")
    p.add_argument("--payload", type=int, default=32, help=f"bytes (>= {PACKET.size})")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--fsync", default="batch", choices=["batch", "none"])
    p.add_argument("--endpoints", help="use a running cluster (ingress endpoints)")
    p.add_argument("--node-arg", action="append", default=[], help="extra node argument")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.payload < PACKET.size or args.rate <= 0 or args.sessions < 1:
        p.error(f"need --payload >= {PACKET.size}, --rate > 0 and --sessions >= 1")
    if args.endpoints:
        result = trio.run(run_probe, args, args.endpoints)
    else:
        with tempfile.TemporaryDirectory(prefix="triarch-probe-") as tmp:
            extra = ["--fsync", args.fsync, "--log-level", "WARNING", *args.node_arg]
            with LocalCluster(
                args.nodes, "cluster.examples.echo:EchoService", tmp, extra_args=extra
            ) as cluster:
                result = trio.run(run_probe, args, cluster.ingress_endpoints)
    if args.json:
        print(json.dumps(result))
    else:
        print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
