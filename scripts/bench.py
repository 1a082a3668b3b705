#!/usr/bin/env python3
"""Benchmark: drive the echo service with many messages in flight.

Starts a local cluster running ``cluster.examples.echo:EchoService`` (or uses
``--endpoints`` of a running one), opens ``--clients`` sessions and keeps ``--in-flight``
messages outstanding in total.  Each payload carries its send time; an echo coming back
means the message was committed (durably appended by a quorum) and applied.  Prints
committed messages/s and round-trip latency percentiles from an HDR-style histogram, as
text or ``--json``.

    python3 scripts/dev.py bench --duration 10 --in-flight 2000 --payload 32
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.certs import make_certs  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402

CERTS_DIR: Path | None = None
"""The clients' certificate folder when the bench runs with --tls."""
from cluster.metrics import Histogram, cpu_seconds  # noqa: E402

STAMP = struct.Struct("<qq")  # sequence, send time (perf_counter_ns)
SENT_AT = operator.itemgetter(slice(8, 16))  # a payload's send time, as STAMP packs it
OPEN_LOOP_TICK = 0.001  # seconds between the open-loop ticker's wake-ups, at least
OPEN_LOOP_IDLE_CHECK = 0.01  # seconds: the ticker looks for new sessions this often


class Stats:
    def __init__(self, sessions: int) -> None:
        self.histogram = Histogram()
        self.sent = 0
        self.received = 0
        self.measured = 0
        self.measuring = False
        self.unconnected = sessions
        self.all_connected = trio.Event()

    def connected(self) -> None:
        self.unconnected -= 1
        if self.unconnected <= 0:
            self.all_connected.set()


class PreciseTimer:
    """Sleeps until a ``time.perf_counter()`` instant to the microsecond.

    ``trio.sleep`` rounds every wait up to whole milliseconds (epoll's unit) and ends it
    by cancelling a scope; a load generator that ticks every millisecond pays both in
    lateness and CPU.  On Linux this waits on a ``timerfd`` (set to an absolute
    ``CLOCK_MONOTONIC`` time, the clock ``perf_counter`` reads) through Trio instead;
    elsewhere it falls back to ``trio.sleep``."""

    def __init__(self) -> None:
        self._fd = -1
        self._settime: Any = None
        self._spec: Any = None
        self._byref: Any = None
        if sys.platform != "linux" or "CLOCK_MONOTONIC" not in (
            time.get_clock_info("perf_counter").implementation
        ):
            return
        import ctypes

        class Timespec(ctypes.Structure):
            _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

        class Itimerspec(ctypes.Structure):
            _fields_ = [("interval", Timespec), ("value", Timespec)]

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(1, os.O_NONBLOCK | os.O_CLOEXEC)  # CLOCK_MONOTONIC
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self._fd, self._settime, self._spec = fd, libc.timerfd_settime, Itimerspec()
            self._byref = ctypes.byref

    async def sleep_until(self, when: float) -> None:
        if self._fd < 0:
            await trio.sleep(max(0.0, when - time.perf_counter()))
            return
        spec = self._spec
        spec.value.sec = int(when)
        spec.value.nsec = max(1, int((when - int(when)) * 1e9))  # 0 would disarm it
        if self._settime(self._fd, 1, self._byref(spec), None) != 0:  # TFD_TIMER_ABSTIME
            await trio.sleep(max(0.0, when - time.perf_counter()))
            return
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                os.read(self._fd, 8)
                return
            except BlockingIOError:
                continue

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class OpenLoop:
    """One clock for every open-loop session: message *k* of a session is due at
    ``start + k / rate`` and its latency counts from then (no coordinated omission).

    A single ticker wakes when the next message of any session is due, but at most once
    every OPEN_LOOP_TICK, and has each session send what has come due, each message
    stamped with its own due time, so a late wake-up (or a session out of credit) shows
    up in the latencies.  One timer for all sessions keeps the load generator's own
    wake-ups from competing with the nodes for the two cores."""

    def __init__(self) -> None:
        #: each sends what is due at the given time and returns when its next is due
        self.senders: list[Callable[[float], Awaitable[float]]] = []

    async def run(self, stop: trio.Event) -> None:
        timer = PreciseTimer()
        try:
            while not stop.is_set():
                now = time.perf_counter()
                wake = now + OPEN_LOOP_IDLE_CHECK
                for send_due in self.senders:
                    wake = min(wake, await send_due(now))
                await timer.sleep_until(max(wake, now + OPEN_LOOP_TICK))
        finally:
            timer.close()


async def run_client(
    endpoints: str,
    stats: Stats,
    window: int,
    payload_size: int,
    stop: trio.Event,
    rate: float | None,
    open_loop: OpenLoop | None = None,
) -> None:
    """One session: keep ``window`` messages in flight (closed loop) or send at ``rate``
    on ``open_loop``'s clock.

    In closed loop the session offers everything its credit allows in one ``offer_many``
    and takes whatever has arrived with ``receive_many``; the task that receives the
    replies sends the next burst, as a request-driven application would (no task switch
    between a reply and the next message).
    """
    padding = b"x" * max(0, payload_size - STAMP.size)
    credit = window
    seq = 0
    pack = STAMP.pack
    closed_loop = not (rate and open_loop is not None)
    async with client.connect(endpoints, connect_timeout=10, certs_dir=CERTS_DIR) as c:
        stats.connected()

        async def send(batch: list[bytes]) -> None:
            nonlocal seq, credit
            await c.offer_many(batch)
            seq += len(batch)
            credit -= len(batch)
            stats.sent += len(batch)

        async def send_window() -> None:
            """Closed loop: offer all the credit there is."""
            if credit > 0 and not stop.is_set():
                intended = time.perf_counter_ns()
                await send([pack(seq + i, intended) + padding for i in range(1, credit + 1)])

        async def receiver() -> None:
            nonlocal credit
            hist = stats.histogram
            while True:
                payloads = await c.receive_many()
                now = time.perf_counter_ns()
                n = len(payloads)
                stats.received += n
                if stats.measuring:
                    stats.measured += n
                    # Messages sent together share a send time: count them in C, then
                    # record each send time once (the generator's own cost stays small).
                    for sent, k in Counter(map(SENT_AT, payloads)).items():
                        hist.record(now - int.from_bytes(sent, "little", signed=True), k)
                credit += n
                if closed_loop:
                    await send_window()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            if rate and open_loop is not None:
                interval = 1.0 / rate
                next_send = time.perf_counter()

                async def send_due(now: float) -> float:
                    nonlocal next_send
                    due = int((now - next_send) / interval) + 1 if now >= next_send else 0
                    burst = min(credit, due)
                    if burst > 0:
                        first = next_send
                        next_send += burst * interval
                        await send(
                            [
                                pack(seq + i, int((first + (i - 1) * interval) * 1e9)) + padding
                                for i in range(1, burst + 1)
                            ]
                        )
                    return next_send

                open_loop.senders.append(send_due)
                await stop.wait()
                open_loop.senders.remove(send_due)
            else:
                await send_window()  # the first window; the receiver sends the rest
                await stop.wait()
            # let in-flight messages come back before closing
            with trio.move_on_after(5):
                while stats.received < stats.sent:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


def session_windows(in_flight: int, clients: int) -> list[int]:
    """Each session's share of ``in_flight``, exactly ``in_flight`` in total: no more
    sessions than messages (``--in-flight 1`` is one message in flight, not one per
    session)."""
    sessions = max(1, min(clients, in_flight))
    return [in_flight // sessions + (i < in_flight % sessions) for i in range(sessions)]


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process (KiB), from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def machine_busy() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat (idle and iowait are not busy)."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(values[:8])
    return total - values[3] - values[4], total


class CpuMeter:
    """CPU used over the measured period by each member, the load generator (this
    process) and the machine: with four processes on two cores, latency under load is a
    matter of who gets the CPU, so the bench reports it next to the latencies."""

    def __init__(self, pids: dict[int, int]) -> None:
        self.pids = pids
        self.start: dict[str, float] = {}
        self.machine: tuple[int, int] | None = None
        self.began = 0.0

    def _read(self) -> dict[str, float]:
        out = {}
        for member, pid in self.pids.items():
            value = cpu_seconds(pid)
            if value is not None:
                out[str(member)] = value
        own = cpu_seconds(os.getpid())
        if own is not None:
            out["bench"] = own
        return out

    def begin(self) -> None:
        self.start = self._read()
        self.machine = machine_busy()
        self.began = time.perf_counter()

    def end(self, messages: int) -> dict[str, object]:
        elapsed = time.perf_counter() - self.began
        now = self._read()
        processes = {
            name: {
                "cores": round((now[name] - before) / elapsed, 3),
                "us_per_message": round((now[name] - before) / max(messages, 1) * 1e6, 1),
            }
            for name, before in self.start.items()
            if name in now
        }
        result: dict[str, object] = {"processes": processes, "cpus": os.cpu_count()}
        machine = machine_busy()
        if self.machine is not None and machine is not None:
            busy, total = (b - a for a, b in zip(self.machine, machine, strict=True))
            result["machine_busy_cores"] = round(busy / max(total, 1) * (os.cpu_count() or 1), 2)
        return result


async def sample_rss(pids: dict[int, int], interval: float, samples: dict[int, list[int]]) -> None:
    while True:
        for member, pid in pids.items():
            value = rss_kib(pid)
            if value is not None:
                samples.setdefault(member, []).append(value)
        await trio.sleep(interval)


def rss_summary(samples: dict[int, list[int]]) -> dict[str, dict[str, float]]:
    """Per member: RSS at the start and end of the measured period, its peak, and the
    growth from start to end (%)."""
    out = {}
    for member, values in sorted(samples.items()):
        first, last = values[0], values[-1]
        out[str(member)] = {
            "first_mib": round(first / 1024, 1),
            "last_mib": round(last / 1024, 1),
            "max_mib": round(max(values) / 1024, 1),
            "growth_pct": round(100 * (last - first) / first, 1),
            "samples": len(values),
        }
    return out


async def bench(
    args: argparse.Namespace, endpoints: str, pids: dict[int, int] | None = None
) -> dict[str, object]:
    windows = session_windows(args.in_flight, args.clients)
    stats = Stats(len(windows))
    rss: dict[int, list[int]] = {}
    stop = trio.Event()
    per_client_rate = args.rate / len(windows) if args.rate else None
    open_loop = OpenLoop() if args.rate else None
    async with trio.open_nursery() as nursery:
        for window in windows:
            nursery.start_soon(
                run_client, endpoints, stats, window, args.payload, stop, per_client_rate, open_loop
            )
        if open_loop is not None:
            nursery.start_soon(open_loop.run, stop)
        # the warm-up (and then the measurement) starts once every session is open, so
        # a slow connect does not count as a slow or missing message
        with trio.fail_after(30):
            await stats.all_connected.wait()
        await trio.sleep(args.warmup)
        stats.measuring = True
        start_received = stats.received
        started = time.perf_counter()
        cpu = CpuMeter(pids or {})
        cpu.begin()
        async with trio.open_nursery() as sampling:
            if pids and args.rss_interval:
                sampling.start_soon(sample_rss, pids, args.rss_interval, rss)
            await trio.sleep(args.duration)
            elapsed = time.perf_counter() - started
            committed = stats.received - start_received
            stats.measuring = False
            cpu_used = cpu.end(committed)
            for member, pid in (pids or {}).items() if args.rss_interval else ():
                value = rss_kib(pid)
                if value is not None:
                    rss.setdefault(member, []).append(value)
            sampling.cancel_scope.cancel()
        stop.set()
    h = stats.histogram
    return {
        "nodes": args.nodes,
        "clients": len(windows),
        "in_flight": args.in_flight,
        "payload_bytes": args.payload,
        "rate": args.rate,
        "fsync": args.fsync,
        "archive_io": args.archive_io,
        "duration_s": round(elapsed, 3),
        "committed_messages": committed,
        "messages_per_s": round(committed / elapsed, 1),
        "payload_mb_per_s": round(committed * args.payload / elapsed / 1e6, 2),
        "latency_us": {
            "p50": h.percentile(50) / 1e3,
            "p90": h.percentile(90) / 1e3,
            "p99": h.percentile(99) / 1e3,
            "p999": h.percentile(99.9) / 1e3,
            "max": h.max / 1e3,
            "mean": round(h.mean / 1e3, 1),
            "samples": h.count,
        },
        "distribution_us": [(p, v / 1e3) for p, v in h.distribution()],
        **({"rss": rss_summary(rss)} if rss else {}),
        "cpu": cpu_used,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=1, choices=[1, 3, 5])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=8000, help="messages outstanding, in total")
    p.add_argument("--payload", type=int, default=32, help="payload bytes (>= 16)")
    p.add_argument("--rate", type=float, default=None, help="open loop: messages/s in total")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    p.add_argument("--fsync", default="batch", choices=["batch", "none"])
    p.add_argument("--archive-io", default="auto", choices=["auto", "inline", "thread"])
    p.add_argument("--endpoints", help="use a running cluster (ingress endpoints)")
    p.add_argument("--dir", help="data directory (default: a temporary one)")
    p.add_argument(
        "--rss-interval",
        type=float,
        default=5.0,
        help="seconds between samples of each node's RSS (local cluster only; 0: off)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="make certificates and run the cluster and clients with mutual TLS",
    )
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument(
        "--out",
        help="write the results as JSON to this file and a latency plot (PNG) next to it",
    )
    p.add_argument(
        "--reads",
        action="store_true",
        help="reads against writes: the KV example's put, get (a linearizable query) and "
        "follower get on the same sessions, side by side (scripts/read_bench.py)",
    )
    p.add_argument(
        "--vs-pysyncobj",
        action="store_true",
        help="then run the equivalent 3-process PySyncObj benchmark (installed if needed) "
        "and print both and their ratio",
    )
    args = p.parse_args()
    if args.payload < STAMP.size:
        p.error(f"--payload must be at least {STAMP.size}")
    if args.rate is not None and not args.rate > 0:
        p.error("--rate must be a positive number of messages per second")
    if args.in_flight < 1 or args.clients < 1:
        p.error("--in-flight and --clients must be at least 1")
    if args.reads and (args.rate or args.vs_pysyncobj or args.out):
        p.error("--reads is closed loop and prints its own table: no --rate, --vs-pysyncobj, --out")
    if args.endpoints:
        if args.reads:
            return reads(args, args.endpoints)
        result = trio.run(bench, args, args.endpoints)
    else:
        with tempfile.TemporaryDirectory(prefix="triarch-bench-") as tmp:
            certs = None
            if args.tls:
                global CERTS_DIR
                certs = Path(tmp) / "certs"
                make_certs(certs, [(i, "127.0.0.1") for i in range(args.nodes)])
                CERTS_DIR = certs / "client-app"
            cluster = LocalCluster(
                args.nodes,
                "cluster.examples.kv:KeyValueService"
                if args.reads
                else "cluster.examples.echo:EchoService",
                args.dir or tmp,
                extra_args=[
                    "--fsync",
                    args.fsync,
                    "--archive-io",
                    args.archive_io,
                    "--max-concurrent-sessions",
                    "1000",
                    "--log-level",
                    "WARNING",
                ],
                certs=certs,
            )
            with cluster:
                pids = {member: proc.pid for member, proc in cluster.processes.items()}
                if args.reads:
                    return reads(args, cluster.ingress_endpoints)
                result = trio.run(bench, args, cluster.ingress_endpoints, pids)
    results = [result]
    if args.vs_pysyncobj:
        peer = run_pysyncobj(args)
        if peer is not None:
            results.append(peer)
    if args.out:
        write_outputs(Path(args.out), results)
    if args.json:
        print(json.dumps(results if len(results) > 1 else result))
        return 0
    for r in results:
        print_text(r, args)
    if len(results) > 1:
        print(comparison(*results))
    return 0


def reads(args: argparse.Namespace, endpoints: str) -> int:
    """``--reads``: put, get and follower get side by side (:mod:`read_bench`)."""
    import read_bench

    windows = session_windows(args.in_flight, args.clients)
    result = trio.run(read_bench.run, endpoints, windows, args.warmup, args.duration, CERTS_DIR)
    if args.json:
        print(json.dumps({"nodes": args.nodes, "clients": len(windows), **result}))
    else:
        read_bench.print_text(result, args.nodes, len(windows), args.in_flight)
    return 0


def comparison(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """The line that compares the two runs: throughput in closed loop; in open loop
    (both offered the same rate) the latencies, and whether the peer kept up."""
    if not ours.get("rate"):
        ratio = float(ours["messages_per_s"]) / max(float(theirs["messages_per_s"]), 1e-9)
        return f"throughput ratio triarch/pysyncobj: {ratio:.2f}x"
    a, b = ours["latency_us"], theirs["latency_us"]
    line = (
        f"open loop at {ours['rate']:,.0f} msg/s, p50 / p99: triarch {a['p50'] / 1e3:.1f} / "
        f"{a['p99'] / 1e3:.1f} ms, pysyncobj {b['p50'] / 1e3:.1f} / {b['p99'] / 1e3:.1f} ms "
        f"(p99 ratio pysyncobj/triarch: {b['p99'] / max(a['p99'], 1e-9):.2f}x)"
    )
    offered = int(theirs.get("offered_messages", 0))
    if offered and int(theirs["committed_messages"]) < offered:
        line += f"; pysyncobj answered {theirs['committed_messages']:,} of {offered:,} calls"
    return line


def print_text(result: dict[str, object], args: argparse.Namespace) -> None:
    lat = result["latency_us"]
    assert isinstance(lat, dict)
    name = result.get("system", "triarch")
    rate = result.get("rate")
    load = f"open loop {rate:,.0f} msg/s" if rate else f"{result['in_flight']} in flight"
    print(
        f"[{name}] {result['nodes']} node(s), {result.get('clients', 1)} clients, "
        f"{load}, {result['payload_bytes']} B payload, "
        f"fsync={result['fsync']}\n"
        f"  committed: {result['messages_per_s']:,.0f} msg/s "
        f"({result.get('payload_mb_per_s', '-')} MB/s payload) over {result['duration_s']} s\n"
        f"  round trip: p50 {lat['p50']:.0f} us  p90 {lat['p90']:.0f} us  "
        f"p99 {lat['p99']:.0f} us  p999 {lat['p999']:.0f} us  max {lat['max']:.0f} us "
        f"({lat['samples']} samples)"
    )
    rss = result.get("rss")
    if isinstance(rss, dict):
        print(
            "  node RSS (MiB, start -> end of the measured period, peak): "
            + ", ".join(
                f"member {m}: {r['first_mib']} -> {r['last_mib']} ({r['growth_pct']:+.1f}%), "
                f"peak {r['max_mib']}"
                for m, r in rss.items()
            )
        )
    cpu = result.get("cpu")
    if isinstance(cpu, dict) and cpu.get("processes"):
        names = {"bench": "load generator"}
        print(
            "  CPU (cores, us per message): "
            + ", ".join(
                f"{names.get(n, 'member ' + n)} {c['cores']:.2f} ({c['us_per_message']:.1f})"
                for n, c in cpu["processes"].items()
            )
            + (
                f"; machine busy {cpu['machine_busy_cores']:.2f} of {cpu['cpus']} cores"
                if "machine_busy_cores" in cpu
                else ""
            )
        )


def ensure_package(module: str, requirement: str) -> bool:
    """Import ``module``, pip-installing ``requirement`` into this environment if needed."""
    import importlib

    try:
        importlib.import_module(module)
        return True
    except ImportError:
        pass
    print(f"installing {requirement} into the bench environment...", file=sys.stderr)
    code = subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", requirement])
    importlib.invalidate_caches()
    return code == 0


def run_pysyncobj(args: argparse.Namespace) -> dict[str, object] | None:
    if not ensure_package("pysyncobj", "pysyncobj"):
        print("could not install pysyncobj", file=sys.stderr)
        return None
    out = subprocess.run(
        [
            sys.executable, str(ROOT / "scripts" / "pysyncobj_bench.py"),
            "--in-flight", str(args.in_flight), "--payload", str(args.payload),
            "--duration", str(args.duration), "--warmup", str(args.warmup),
            *(["--rate", str(args.rate)] if args.rate else []),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"pysyncobj benchmark failed: {out.stderr[-1000:]}", file=sys.stderr)
        return None
    result: dict[str, object] = json.loads(lines[-1])
    return result


def plot_percentiles(ax: Any, points: Any, label: str) -> None:
    """One latency-by-percentile curve from ``(percentile, µs)`` points (``distribution_us``
    of bench.py, probe.py and floor_bench.py), in ms, on :func:`percentile_axis`'s x axis."""
    xs = [min(1e5, 1 / max(1e-5, 1 - q / 100)) for q, _ in points]
    ax.plot(xs, [v / 1000 for _, v in points], label=label)


def percentile_axis(ax: Any) -> None:
    """A log axis of 1 / (1 - percentile): the tail spread out, labelled in percentiles."""
    ax.set_xscale("log")
    ax.set_xticks([2, 10, 100, 1000, 10000])
    ax.set_xticklabels(["50%", "90%", "99%", "99.9%", "99.99%"])
    ax.grid(True, which="both", alpha=0.3)


def write_outputs(path: Path, results: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    if not ensure_package("matplotlib", "matplotlib"):
        print("matplotlib unavailable: no plot", file=sys.stderr)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        label = f"{r.get('system', 'triarch')} ({float(r['messages_per_s']):,.0f} msg/s)"  # type: ignore[arg-type]
        plot_percentiles(ax, r["distribution_us"], label)
    percentile_axis(ax)
    ax.set_xlabel("percentile")
    ax.set_ylabel("round-trip latency (ms)")
    ax.set_title("Latency by percentile, committed echo round trip")
    ax.legend()
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=100)
    print(f"wrote {path} and {png}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
