#!/usr/bin/env python3
"""Soak: a local cluster under steady key-value load, with faults, for as long as asked.

Starts ``--nodes`` ``python -m cluster.node`` processes running the key-value service and
keeps, for ``--minutes``:

- ``--writers`` sessions putting values of 100-1,000 bytes over ``--keys`` keys (each
  writer its own keys, never two puts of one key in flight, so the last acknowledged
  value of a key is the value it must hold) at ``--rate`` puts/s in all: the service's
  state stops growing once every key has been written, so a member's memory should too;
- session churn: ``--churn`` new sessions a second, each doing one put; one in five
  is dropped without a close (its connection just closes, the cluster times it out);
- a fault every ``--fault-every`` seconds, in turn: the leader killed (SIGKILL) and
  restarted, a follower paused (SIGSTOP) for 8 s, a snapshot, a follower stopped
  (SIGTERM) and restarted.

Every ``--sample-every`` seconds it samples each member's resident memory, open
descriptors and data directory size, and the writers' latency.  At the end it reads
every acknowledged key back and writes ``soak.csv`` (the samples), ``soak.png`` (a plot)
and ``soak.json`` (the summary) to ``--out``.  RSS growth is fitted per process (a
restarted member starts again) after ``--warmup`` seconds of its life, in MB per hour.

    python3 scripts/soak.py --minutes 20 --out soak-out
    python3 scripts/soak.py --minutes 1 --max-rss-slope 200   # what the test suite runs

Exit code 0 when nothing acknowledged was lost and no member's RSS grew faster than
``--max-rss-slope`` MB/h after its warm-up; 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import client  # noqa: E402
from cluster.examples.kv import KeyValueClient  # noqa: E402
from cluster.local import LocalCluster  # noqa: E402
from cluster.protocol import EGRESS, PROTOCOL_VERSION, FrameDecoder, encode_frame  # noqa: E402
from cluster.protocol.egress import SessionEvent  # noqa: E402
from cluster.protocol.enums import EventCode  # noqa: E402
from cluster.protocol.ingress import SessionConnectRequest  # noqa: E402

KV = "cluster.examples.kv:KeyValueService"
NODE_ARGS = [
    "--election-timeout",
    "500ms",
    "--leader-heartbeat-timeout",
    "2s",
]
FAULTS = ("kill-leader", "pause-follower", "snapshot", "restart-follower")


# ---------------------------------------------------------------------- the members


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def tool(
    cluster: LocalCluster, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.tool", "--members", cluster.members, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def leader_of(cluster: LocalCluster) -> int | None:
    done = tool(cluster, "describe", "--json", timeout=20)
    with suppress(ValueError, KeyError, TypeError):
        leader = int(json.loads(done.stdout)["leader_member_id"])
        return leader if leader >= 0 else None
    return None


# ---------------------------------------------------------------------- the load


@dataclass
class Stats:
    acked: dict[str, bytes] = field(default_factory=dict)
    history: dict[str, list[tuple[float, float, bytes]]] = field(default_factory=dict)
    """Every acknowledged put of a key: (sent, acknowledged, value), to explain a loss."""
    uncertain: set[str] = field(default_factory=set)
    latencies: list[float] = field(default_factory=list)  # since the last sample
    puts: int = 0
    errors: int = 0
    sessions_opened: int = 0
    sessions_dropped: int = 0
    churn_failures: int = 0
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)  # seconds, restart to serving


@asynccontextmanager
async def connect_with_retries(endpoints: str, attempts: int = 10) -> AsyncIterator[Any]:
    """``client.connect``, tried again after a refusal (sessions connecting at once from one
    address are limited) or a timeout (an election at start-up)."""
    for attempt in itertools.count(1):
        stack = AsyncExitStack()
        try:
            c = await stack.enter_async_context(client.connect(endpoints, connect_timeout=20))
        except (client.SessionRejectedError, client.ConnectTimeoutError):
            if attempt >= attempts:
                raise
            await trio.sleep(0.2 * attempt)
            continue
        async with stack:
            yield c
        return


async def writer(
    index: int, endpoints: str, keys: int, rate: float, stats: Stats, rng: random.Random
) -> None:
    """Puts at ``rate``/s over this writer's keys, one put per key at a time."""
    busy: set[int] = set()
    async with AsyncExitStack() as stack:
        c = await stack.enter_async_context(connect_with_retries(endpoints))
        kv = await stack.enter_async_context(KeyValueClient(c, timeout=60))

        async def put(k: int) -> None:
            key = f"w{index}-{k}"
            value = rng.randbytes(rng.randint(100, 1000))
            sent = time.monotonic()
            try:
                await kv.put(key, value)
            except (client.ClusterClientError, TimeoutError):
                stats.errors += 1
                stats.uncertain.add(key)
                stats.acked.pop(key, None)
            except trio.Cancelled:  # the soak ends: it may yet be applied, unacknowledged
                stats.uncertain.add(key)
                stats.acked.pop(key, None)
                raise
            else:
                stats.acked[key] = value
                stats.history.setdefault(key, []).append((sent, time.monotonic(), value))
                stats.uncertain.discard(key)
                stats.latencies.append(time.monotonic() - sent)
                stats.puts += 1
            finally:
                busy.discard(k)

        async with trio.open_nursery() as nursery:
            interval = 1.0 / rate
            deadline = trio.current_time()
            while True:
                deadline += interval
                await trio.sleep_until(deadline)
                k = rng.randrange(keys)
                if k in busy:
                    continue
                busy.add(k)
                nursery.start_soon(put, k)


async def raw_session_dropped(endpoints: dict[int, tuple[str, int]], rng: random.Random) -> bool:
    """Open a session speaking the protocol, then drop its connection without a close."""
    member = rng.choice(list(endpoints))
    for _ in range(3):
        with trio.move_on_after(5):
            stream = await trio.open_tcp_stream(*endpoints[member])
            async with stream:
                await stream.send_all(
                    encode_frame(
                        SessionConnectRequest(rng.randrange(1 << 30), 7, PROTOCOL_VERSION, "")
                    )
                )
                decoder = FrameDecoder()
                while True:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        break
                    events = [
                        m
                        for m in map(EGRESS.decode, decoder.feed(data))
                        if isinstance(m, SessionEvent)
                    ]
                    if not events:
                        continue
                    event = events[0]
                    if event.code is EventCode.OK:
                        return True  # and the connection drops here, unclosed
                    if event.code is EventCode.REDIRECT and event.leader_member_id in endpoints:
                        member = event.leader_member_id
                    break
        await trio.sleep(0.2)
    return False


async def churn(endpoints: str, per_second: float, stats: Stats, rng: random.Random) -> None:
    addresses: dict[int, tuple[str, int]] = {}
    for part in endpoints.split(","):
        member, _, hostport = part.partition("=")
        host, _, port = hostport.rpartition(":")
        addresses[int(member)] = (host, int(port))

    async def one(n: int) -> None:
        try:
            if n % 5 == 4:
                if await raw_session_dropped(addresses, rng):
                    stats.sessions_dropped += 1
                else:
                    stats.churn_failures += 1
                return
            with trio.fail_after(30):
                async with connect_with_retries(endpoints, attempts=3) as c:
                    async with KeyValueClient(c) as kv:
                        await kv.put(f"churn-{n % 1000}", b"x")
            stats.sessions_opened += 1
        except (client.ClusterClientError, TimeoutError, OSError):
            stats.churn_failures += 1

    async with trio.open_nursery() as nursery:
        for n in itertools.count():
            nursery.start_soon(one, n)
            await trio.sleep(1.0 / per_second)


async def restart(cluster: LocalCluster, member: int, stats: Stats) -> str:
    """Start ``member`` again; how long until it serves (its recovery: the latest snapshot
    loaded and the log after it replayed)."""
    started = time.monotonic()
    cluster.start(member)
    try:
        await trio.to_thread.run_sync(lambda: cluster.wait_ready(120, member_ids=[member]))
    except RuntimeError as exc:
        return f"did not come back: {exc}"
    took = time.monotonic() - started
    stats.recoveries.append(round(took, 2))
    return f"back in {took:.2f} s"


async def faults(
    cluster: LocalCluster, every: float, kinds: list[str], stats: Stats, started: float
) -> None:
    for n in itertools.count():
        await trio.sleep(every)
        kind = kinds[n % len(kinds)]
        leader = await trio.to_thread.run_sync(leader_of, cluster)
        if leader is None:
            stats.faults.append((time.monotonic() - started, kind, "skipped: no leader"))
            continue
        followers = [m for m in cluster.processes if m != leader]
        what = ""
        if kind == "kill-leader":
            cluster.kill(leader)
            await trio.sleep(5)
            what = f"member {leader}, {await restart(cluster, leader, stats)}"
        elif kind == "pause-follower" and followers:
            member = followers[n % len(followers)]
            cluster.signal(member, signal.SIGSTOP)
            await trio.sleep(8)
            cluster.signal(member, signal.SIGCONT)
            what = f"member {member}"
        elif kind == "snapshot":
            done = await trio.to_thread.run_sync(tool, cluster, "snapshot")
            what = "ok" if done.returncode == 0 else done.stdout.strip()[-200:]
        elif followers:
            member = followers[n % len(followers)]
            await trio.to_thread.run_sync(cluster.stop, member)
            await trio.sleep(5)
            what = f"member {member}, {await restart(cluster, member, stats)}"
        stats.faults.append((time.monotonic() - started, kind, what))


# ---------------------------------------------------------------------- samples


@dataclass
class Sample:
    t: float
    member: int
    pid: int
    rss_mb: float
    fds: int
    disk_mb: float
    p50_ms: float
    p99_ms: float
    puts: int


async def sampler(
    cluster: LocalCluster, every: float, stats: Stats, samples: list[Sample], started: float
) -> None:
    while True:
        await trio.sleep(every)
        latencies, stats.latencies = stats.latencies, []
        p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
        p99 = (
            statistics.quantiles(latencies, n=100)[98] * 1000
            if len(latencies) >= 2
            else float("nan")
        )
        now = time.monotonic() - started
        for member, proc in list(cluster.processes.items()):
            if proc.poll() is not None:
                continue
            rss = rss_bytes(proc.pid)
            fds = open_fds(proc.pid)
            if rss is None or fds is None:
                continue
            disk = dir_bytes(cluster.directory / f"node-{member}")
            samples.append(
                Sample(now, member, proc.pid, rss / 1e6, fds, disk / 1e6, p50, p99, stats.puts)
            )


def explain(read: bytes | None, puts: list[tuple[float, float, bytes]], started: float) -> str:
    """What a key that did not read back held instead, against its acknowledged puts."""
    older = [i for i, (_sent, _acked, value) in enumerate(puts) if value == read]
    what = "nothing" if read is None else f"{len(read)} bytes"
    whose = f"acknowledged put {older[-1] + 1} of {len(puts)}" if older else "no put of ours"
    times = [(round(a - started, 2), round(b - started, 2)) for a, b, _ in puts[-4:]]
    return f"read {what} ({whose}); last puts (sent, acked) at s: {times}"


def slope_mb_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    if len(points) < 3:
        return 0.0
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 3600


def rss_slopes(samples: list[Sample], warmup: float) -> dict[str, float]:
    """Per process (member and pid), the RSS slope after ``warmup`` s of its life."""
    lives: dict[tuple[int, int], list[Sample]] = {}
    for s in samples:
        lives.setdefault((s.member, s.pid), []).append(s)
    slopes: dict[str, float] = {}
    for (member, pid), life in lives.items():
        born = life[0].t
        points = [(s.t, s.rss_mb) for s in life if s.t - born >= warmup]
        if len(points) >= 5:
            slopes[f"member {member} pid {pid}"] = slope_mb_per_hour(points)
    return slopes


def write_outputs(out: Path, samples: list[Sample], summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "soak.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(Sample.__dataclass_fields__))
        w.writeheader()
        for s in samples:
            w.writerow(asdict(s))
    (out / "soak.json").write_text(json.dumps(summary, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    members = sorted({s.member for s in samples})
    for member in members:
        mine = [s for s in samples if s.member == member]
        t = [s.t / 60 for s in mine]
        axes[0].plot(t, [s.rss_mb for s in mine], ".", markersize=3, label=f"member {member}")
        axes[1].plot(t, [s.disk_mb for s in mine], ".", markersize=3, label=f"member {member}")
        axes[2].plot(t, [s.fds for s in mine], ".", markersize=3, label=f"member {member}")
    first = [s for s in samples if s.member == members[0]] if members else []
    axes[3].plot([s.t / 60 for s in first], [s.p99_ms for s in first], label="p99")
    axes[3].plot([s.t / 60 for s in first], [s.p50_ms for s in first], label="p50")
    for ax, label in zip(
        axes,
        ("RSS (MB)", "data directory (MB)", "open descriptors", "put latency (ms)"),
        strict=True,
    ):
        ax.set_ylabel(label)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    for t, kind, _what in summary.get("faults", []):
        for ax in axes:
            ax.axvline(t / 60, color="grey", alpha=0.3, linewidth=0.8)
        axes[0].annotate(
            kind, (t / 60, 0), xycoords=("data", "axes fraction"), fontsize=6, rotation=90
        )
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- main


async def soak(
    args: argparse.Namespace, cluster: LocalCluster
) -> tuple[dict[str, Any], list[Sample]]:
    stats = Stats()
    samples: list[Sample] = []
    rng = random.Random(args.seed)
    started = time.monotonic()
    endpoints = cluster.ingress_endpoints
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler, cluster, args.sample_every, stats, samples, started)
        for i in range(args.writers):
            nursery.start_soon(
                writer,
                i,
                endpoints,
                args.keys // args.writers,
                args.rate / args.writers,
                stats,
                random.Random(rng.random()),
            )
        if args.churn > 0:
            nursery.start_soon(churn, endpoints, args.churn, stats, random.Random(rng.random()))
        if args.fault_every > 0:
            kinds = args.faults.split(",")
            nursery.start_soon(faults, cluster, args.fault_every, kinds, stats, started)
        await trio.sleep(args.minutes * 60)
        nursery.cancel_scope.cancel()
    # every member up again (a fault may have been cut short), then read everything back
    for member in range(cluster.nodes):
        proc = cluster.processes.get(member)
        if proc is None or proc.poll() is not None:
            cluster.start(member)
        else:
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
    await trio.to_thread.run_sync(lambda: cluster.wait_ready(30))
    lost: list[str] = []
    explained: dict[str, str] = {}
    async with (
        connect_with_retries(endpoints) as c,
        KeyValueClient(c, timeout=60) as kv,
    ):
        limiter = trio.CapacityLimiter(64)

        async def check(key: str, value: bytes) -> None:
            async with limiter:
                read = await kv.get(key)
                if read != value:
                    lost.append(key)
                    explained[key] = explain(read, stats.history.get(key, []), started)

        async with trio.open_nursery() as nursery:
            for key, value in list(stats.acked.items()):
                nursery.start_soon(check, key, value)
    slopes = rss_slopes(samples, args.warmup)
    final = {s.member: s for s in samples}
    summary = {
        "minutes": args.minutes,
        "puts_acknowledged": stats.puts,
        "put_errors": stats.errors,
        "keys_checked": len(stats.acked),
        "keys_uncertain": len(stats.uncertain),
        "lost": sorted(lost)[:100],
        "lost_count": len(lost),
        "lost_explained": dict(list(explained.items())[:20]),
        "sessions_opened": stats.sessions_opened,
        "sessions_dropped": stats.sessions_dropped,
        "churn_failures": stats.churn_failures,
        "faults": stats.faults,
        "recovery_s": stats.recoveries,
        "rss_slope_mb_per_hour": slopes,
        "final_rss_mb": {m: round(s.rss_mb, 1) for m, s in final.items()},
        "final_fds": {m: s.fds for m, s in final.items()},
        "final_disk_mb": {m: round(s.disk_mb, 1) for m, s in final.items()},
        "p99_ms_median": statistics.median(
            [s.p99_ms for s in samples if s.p99_ms == s.p99_ms] or [float("nan")]
        ),
    }
    return summary, samples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--rate", type=float, default=425.0, help="puts/s, all writers together")
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--churn", type=float, default=2.0, help="new sessions a second")
    p.add_argument("--fault-every", type=float, default=180.0, help="seconds (0: none)")
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"the faults, in turn (default {','.join(FAULTS)})",
    )
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=120.0, help="seconds of a process's life")
    p.add_argument("--max-rss-slope", type=float, default=None, help="MB/h; fail above")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("soak-out"), help="table, plot, summary")
    p.add_argument("--dir", type=Path, default=None, help="data directories (default: a temp dir)")
    p.add_argument("node_args", nargs="*", help="after --: more arguments for every node")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        print(f"error: unknown faults {sorted(unknown)}: choose from {FAULTS}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        directory = args.dir or Path(tmp)
        cluster = LocalCluster(args.nodes, KV, directory, extra_args=[*NODE_ARGS, *args.node_args])
        try:
            cluster.start_all(timeout=30)
            summary, samples = trio.run(soak, args, cluster)
        finally:
            for proc in cluster.processes.values():
                if proc.poll() is None:
                    with suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGCONT)
            cluster.stop_all()
        write_outputs(args.out, samples, summary)
        print(json.dumps(summary, indent=2))
        failed = summary["lost_count"] > 0
        if args.max_rss_slope is not None:
            worst = max(summary["rss_slope_mb_per_hour"].values(), default=0.0)
            failed = failed or worst > args.max_rss_slope
        print(f"table, plot and summary in {args.out}/soak.*", file=sys.stderr)
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
