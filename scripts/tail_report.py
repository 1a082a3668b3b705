#!/usr/bin/env python3
"""The tail-latency figures in one run: Triarch's tail under a paced load against the
floor of the same machine under the same load, and the one-in-flight ratios.

For each ``--rates`` rate: ``scripts/probe.py`` on a fresh 3-node cluster (every reply
timed from its real send; afterwards each member's stall finder is asked what stalled),
then ``scripts/floor_bench.py --rate`` with Trio and with plain nodes (the same four
hops and syncs with nothing else).  Then one in flight: the floor (closed loop) and
``bench.py --clients 1 --in-flight 1``.  Prints a Markdown table and the targets' ratios;
``--json`` for the raw results; ``--plot FILE.png`` draws latency by percentile for each
load (Triarch, and the two floors) and the stalls each member recorded, over time.

    .venv/bin/python scripts/tail_report.py --rates 200 500 1000 --duration 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import ensure_package, percentile_axis, plot_percentiles  # noqa: E402

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
            began = time.time()
            result = run_json(
                str(SCRIPTS / "probe.py"), "--endpoints", c.ingress_endpoints,
                "--rate", str(rate), "--duration", str(duration), "--json",
            )  # fmt: skip
            stalls = run_json("-m", "cluster.tool", "--members", c.members, "--json", "stalls")
    members = stalls["members"]
    records = [{**x, "member": m["member_id"]} for m in members for x in m["recent"] or []]
    result["began"] = began
    result["stalls"] = {
        "records": records,
        "busy": sum(m["busy"] or 0 for m in members),
        "late": sum(m["late"] or 0 for m in members),
        "longest": sorted(records, key=lambda x: -x["duration_s"])[:5],
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
    p.add_argument("--plot", type=Path, help="draw the figures into this PNG file")
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
    if args.plot:
        plot(report, args.plot)
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
            cpu = f"{x['cpu_s'] * 1e3:.1f} ms" if x["cpu_s"] >= 0 else "not sampled"
            print(
                f"  at {row['rate']:,.0f}/s: {x['kind']} {x['duration_s'] * 1e3:.1f} ms, "
                f"cpu {cpu}, gc {x['gc_s'] * 1e3:.1f} ms: {x['where'][:110]}"
            )
    return 0


def plot(report: dict[str, Any], path: Path) -> None:
    """Latency by percentile for each load (Triarch and both floors), and every stall the
    members recorded (their last 32 each) against the time since the probe began."""
    if not ensure_package("matplotlib", "matplotlib"):
        print("matplotlib unavailable: no plot", file=sys.stderr)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def three(title: str, ours: Any, trio_floor: Any, plain_floor: Any) -> Any:
        curves = [("Triarch", ours), ("floor, Trio nodes", trio_floor)]
        return title, [*curves, ("floor, plain nodes", plain_floor)]

    loads = [
        three(f"paced, {r['rate']:,.0f} msg/s", r["triarch"], r["floor_trio"], r["floor_plain"])
        for r in report["paced"]
    ]
    floors = report["closed_floor"]
    ours = report["closed_bench"]
    loads.append(three("one in flight (closed loop)", ours, floors["trio"], floors["plain"]))
    columns = 3
    rows = (len(loads) + 1 + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax, (title, curves) in zip(flat, loads, strict=False):
        for label, result in curves:
            plot_percentiles(ax, result.get("distribution_us") or [], label)
        percentile_axis(ax)
        ax.set_title(title)
        ax.set_ylabel("latency (ms)")
        ax.legend(fontsize="small")
    ax = flat[len(loads)]
    for row in report["paced"]:
        records = row["triarch"]["stalls"]["records"]
        began = row["triarch"]["began"]
        ax.scatter(
            [x["at"] - began for x in records],
            [x["duration_s"] * 1e3 for x in records],
            s=12,
            label=f"{row['rate']:,.0f} msg/s ({len(records)})",
        )
    ax.set_title("stalls the members recorded (their last 32 each)")
    ax.set_xlabel("seconds since the probe began")
    ax.set_ylabel("stall (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    for ax in flat[len(loads) + 1 :]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
