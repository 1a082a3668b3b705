#!/usr/bin/env python3
"""Benchmark of ``cluster-pipeline``: seconds per million log entries as the archive grows.

Writes synthetic archives with the archive API (``Archive.append`` of framed records, no
cluster needed): a leadership term, sessions of ``--session-length`` client messages
(``--payload`` bytes each) with their open and close events, a timer now and then, one
millisecond of cluster time per ``--rate`` entries; ``node-state.json`` and
``recording.log`` as a member leaves them.  ``--members`` > 1 copies the archive to
more members (the consistency check then compares them).  Then runs the job in one Spark
session on each size, after a warm-up run on a small archive so that the JVM start is
not counted, and prints the time per million entries (all members' entries counted).

    .venv/bin/python scripts/pipeline_bench.py --entries 250000 500000 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.archive import Archive, FsyncPolicy, RecordingLog, append_record  # noqa: E402
from cluster.archive.node_state import NodeState  # noqa: E402
from cluster.config import parse_size  # noqa: E402
from cluster.protocol import codec  # noqa: E402
from cluster.protocol.enums import CloseReason, ClusterTimeUnit  # noqa: E402
from cluster.protocol.ingress import SessionMessageHeader  # noqa: E402
from cluster.protocol.log import (  # noqa: E402
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
)

START_MS = 1_700_000_000_000


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and its descendants (the Spark JVM and its
    Python workers), from /proc: with other work on the machine, wall time alone says
    little.  0 where /proc is missing."""
    proc = Path("/proc")
    if not proc.is_dir():
        return 0.0
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(times.get(pid, 0.0) for pid in mine)


def write_member(
    directory: Path,
    entries: int,
    *,
    segment_size: int,
    payload: int,
    session_length: int,
    rate: int,
) -> int:
    """Write a member directory with ``entries`` log entries; return the log's end."""
    archive_dir = directory / "archive"
    archive_dir.mkdir(parents=True)
    encode = codec.encode
    body = bytes(payload)
    buf = bytearray()
    written = 0
    session = 0
    in_session = 0
    correlation = 0
    with Archive.open(archive_dir, segment_size=segment_size, fsync=FsyncPolicy.NONE) as archive:
        for i in range(entries):
            now = START_MS + i // rate
            if i == 0:
                message: Any = NewLeadershipTermEvent(0, 0, now, 0, 0, 0, ClusterTimeUnit.MILLIS, 0)
            elif in_session == 0:
                session += 1
                correlation += 1
                message = SessionOpenEvent(0, correlation, session, now, 0, "egress")
                in_session = 1
            elif in_session > session_length or i == entries - 1:
                message = SessionCloseEvent(0, session, now, CloseReason.CLIENT_ACTION)
                in_session = 0
            elif i % 10_000 == 0:
                correlation += 1
                message = TimerEvent(0, correlation, now)
            else:
                message = SessionMessageHeader(0, session, now, body)
                in_session += 1
            append_record(buf, encode(message))
            written += 1
            if len(buf) >= 1 << 20:
                archive.append(buf)
                buf.clear()
        if buf:
            archive.append(buf)
        end = archive.position
    NodeState(directory).save(candidate_term_id=0, commit_position=end)
    with RecordingLog.open(directory) as recording_log:
        recording_log.append_term(0, 0, START_MS)
    assert written == entries
    return end


def make_cluster(root: Path, entries: int, members: int, **kwargs: int) -> Path:
    first = root / "node-0"
    write_member(first, entries, **kwargs)
    for member in range(1, members):
        shutil.copytree(first, root / f"node-{member}")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[250_000, 500_000, 1_000_000])
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--segment-size", type=parse_size, default="16MiB")
    parser.add_argument("--payload", type=int, default=32)
    parser.add_argument("--session-length", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=50, help="entries per millisecond")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    from cluster.pipeline.job import Options, build_session, run

    conf = dict(c.split("=", 1) for c in args.conf)
    work = args.dir or Path(tempfile.mkdtemp(prefix="triarch-pipeline-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = {
        "segment_size": args.segment_size,
        "payload": args.payload,
        "session_length": args.session_length,
        "rate": args.rate,
    }
    try:
        spark = build_session(args.master, conf)
        warm = make_cluster(work / "warm-up", 20_000, args.members, **shape)
        run(Options([warm], work / "warm-up-out", plot=False), spark)
        results = []
        for entries in args.entries:
            started = time.monotonic()
            directory = make_cluster(work / f"n{entries}", entries, args.members, **shape)
            generated = time.monotonic() - started
            size = sum(p.stat().st_size for p in directory.rglob("*.seg"))
            cpu = tree_cpu_seconds()
            result = run(Options([directory], work / f"out-{entries}"), spark)
            cpu = tree_cpu_seconds() - cpu
            report = result.report
            total = sum(a["entries"] for a in report["archives"])
            assert report["log"]["entries"] == entries, report["log"]
            assert report["consistent"]
            seconds = report["elapsed_seconds"]
            results.append(
                {
                    "entries_per_member": entries,
                    "members": args.members,
                    "entries": total,
                    "archive_bytes": size,
                    "segments": sum(a["segments"] for a in report["archives"]),
                    "seconds": seconds,
                    "seconds_per_million": round(seconds / total * 1e6, 2),
                    "cpu_seconds": round(cpu, 2),
                    "cpu_seconds_per_million": round(cpu / total * 1e6, 2),
                    "scan_seconds": report["timings"]["scan"],
                    "timings": report["timings"],
                    "generate_seconds": round(generated, 2),
                }
            )
            shutil.rmtree(directory)
            if not args.json:
                r = results[-1]
                print(
                    f"{r['entries']:>9} entries ({r['members']} member(s), "
                    f"{r['archive_bytes'] / 1e6:.0f} MB, {r['segments']} segments): "
                    f"{r['seconds']:.1f} s = {r['seconds_per_million']:.1f} s per million "
                    f"(CPU {r['cpu_seconds']:.1f} s = {r['cpu_seconds_per_million']:.1f} s per "
                    f"million) {r['timings']}",
                    flush=True,
                )
        spark.stop()
        if args.json:
            print(json.dumps({"master": args.master, "results": results}, indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
