#!/usr/bin/env python3
"""Issue #22's figures in one run: Triarch's tail under a paced load against the floor of
the same machine under the same load, and the one-in-flight ratios.

For each ``--rates`` rate: ``scripts/probe.py`` on a fresh 3-node cluster (every reply
timed from its real send; afterwards each member's stall finder is asked what stalled),
then ``scripts/floor_bench.py --rate`` with Trio and with plain nodes (the same four
hops and syncs with nothing else).  Then one in flight: the floor (closed loop) and
``bench.py --clients 1 --in-flight 1``.  Prints a Markdown table and the targets' ratios;
``--json`` for the raw results.

    .venv/bin/python scripts/tail_report.py --rates 200 500 1000 --duration 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster.local import LocalCluster  # noqa: E402

SCRIPTS = ROOT / "scripts"


def run_json(*command: str, timeout: float = 600) -> Any:
    out = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if out.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def probe(rate: float, duration: float, node_args: list[str]) -> dict[str, Any]:
    """The probe on a fresh cluster, and what each member's stall finder saw."""
    with tempfile.TemporaryDirectory(prefix="triarch-tail-") as tmp:
        extra = ["--log-level", "WARNING", *node_args]
        with LocalCluster(3, "cluster.examples.echo:EchoService", tmp, extra_args=extra) as c:
            result = run_json(
                str(SCRIPTS / "probe.py"), "--endpoints", c.ingress_endpoints,
                "--rate", str(rate), "--duration", str(duration), "--json",
            )  # fmt: skip
            stalls = run_json("-m", "cluster.tool", "--members", c.members, "--json", "stalls")
    recent = [x for m in stalls["members"] for x in m["recent"]]
    result["stalls"] = {
        "busy": sum(m["busy"] or 0 for m in stalls["members"]),
        "late": sum(m["late"] or 0 for m in stalls["members"]),
        "longest": sorted(recent, key=lambda x: -x["duration_s"])[:5],
    }
    return result


def floor(rate: float | None, count: int) -> list[dict[str, Any]]:
    args = [str(SCRIPTS / "floor_bench.py"), "--count", str(count), "--json"]
    if rate:
        args += ["--rate", str(rate)]
    result = run_json(*args)
    return result if isinstance(result, list) else [result]


def ms(us: float) -> str:
    return f"{us / 1e3:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rates", type=float, nargs="+", default=[200.0, 500.0, 1000.0])
    p.add_argument("--duration", type=float, default=8.0, help="seconds per probe")
    p.add_argument("--node-arg", action="append", default=[], help="extra node argument")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    for rate in args.rates:
        ours = probe(rate, args.duration, args.node_arg)
        plain, trio_ = floor(rate, int(rate * args.duration))
        rows.append({"rate": rate, "triarch": ours, "floor_trio": trio_, "floor_plain": plain})
    closed_floor = {r["nodes"]: r for r in floor(None, 3000)}
    bench = run_json(
        str(SCRIPTS / "bench.py"), "--nodes", "3", "--clients", "1", "--in-flight", "1",
        "--duration", "5", "--json",
    )  # fmt: skip
    report = {"paced": rows, "closed_floor": closed_floor, "closed_bench": bench}
    if args.json:
        print(json.dumps(report))
        return 0
    print("| paced rate | Triarch p50 / p99 / p999 / max (ms) | floor, Trio nodes | floor, plain "
          "| p99 / floor-Trio p99 | max / floor-Trio max | stalls busy / late |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        t, f, q = row["triarch"]["latency_us"], row["floor_trio"]["latency_us"], row["floor_plain"]
        q = q["latency_us"]
        st = row["triarch"]["stalls"]
        print(
            f"| {row['rate']:,.0f}/s | {ms(t['p50'])} / {ms(t['p99'])} / {ms(t['p999'])} / "
            f"{ms(t['max'])} | {ms(f['p50'])} / {ms(f['p99'])} / {ms(f['p999'])} / "
            f"{ms(f['max'])} | {ms(q['p50'])} / {ms(q['p99'])} / {ms(q['max'])} | "
            f"{t['p99'] / f['p99']:.1f}x | {t['max'] / f['max']:.1f}x | "
            f"{st['busy']} / {st['late']} |"
        )
    b, ft = bench["latency_us"], closed_floor["trio"]["latency_us"]
    fp = closed_floor["plain"]["latency_us"]
    print(
        f"\none in flight (closed loop): Triarch p50 {ms(b['p50'])} p99 {ms(b['p99'])} ms; "
        f"floor Trio p50 {ms(ft['p50'])} p99 {ms(ft['p99'])}; plain p50 {ms(fp['p50'])} "
        f"p99 {ms(fp['p99'])}: Triarch/Trio floor p50 {b['p50'] / ft['p50']:.2f}x, "
        f"p99 {b['p99'] / ft['p99']:.2f}x"
    )
    for row in rows:
        for x in row["triarch"]["stalls"]["longest"][:3]:
            print(
                f"  at {row['rate']:,.0f}/s: {x['kind']} {x['duration_s'] * 1e3:.1f} ms, "
                f"cpu {x['cpu_s'] * 1e3:.1f} ms, gc {x['gc_s'] * 1e3:.1f} ms: {x['where'][:110]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
