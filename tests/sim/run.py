"""Run the deterministic simulator from the command line: replay one seed, or soak many.

    .venv/bin/python -m tests.sim.run --seed 1234 --nodes 3            # replay one seed
    .venv/bin/python -m tests.sim.run --seed 1234 --nodes 3 --trace    # ...and print its trace
    .venv/bin/python -m tests.sim.run --seeds 5000 --start 0 --nodes 3 # soak: seeds 0..4999

Exit status 1 if any seed failed; every failure prints its replay command.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .harness import SimCluster, SimFailure


def run_seed(
    seed: int,
    nodes: int,
    *,
    trace: bool = False,
    keep: Path | None = None,
    overrides: dict[str, float] | None = None,
) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        base = keep if keep is not None else Path(tmp)
        sim = SimCluster(
            seed, nodes, base, trace=trace, keep_dirs=keep is not None, **(overrides or {})
        )
        try:
            result = sim.run()
        except SimFailure as exc:
            if trace:
                print(sim.format_trace(), flush=True)
                print("\n".join(sim.log_lines), flush=True)
            return False, str(exc)
        if trace:
            print(sim.format_trace(), flush=True)
            print("\n".join(sim.log_lines), flush=True)
        return True, f"{result.summary()} hash {result.trace_hash[:16]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.run", description=__doc__)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (soak)")
    parser.add_argument("--start", type=int, default=0, help="first seed of a soak")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--trace", action="store_true", help="print the run's trace")
    parser.add_argument("--keep", type=Path, help="keep node directories under this path")
    parser.add_argument("--safety", type=float, help="safety phase duration (virtual s)")
    parser.add_argument("--quiet", action="store_true", help="print failures only")
    parser.add_argument(
        "--clock-overshoot",
        type=float,
        metavar="SECONDS",
        help="autojump this far past each deadline (default 0: exactly onto it)",
    )
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    overrides: dict[str, float] = {}
    if args.safety is not None:
        overrides["safety_duration"] = args.safety
    if args.clock_overshoot is not None:
        overrides["clock_overshoot"] = args.clock_overshoot
    failed: list[int] = []
    began = time.perf_counter()
    for seed in seeds:
        t0 = time.perf_counter()
        ok, text = run_seed(seed, args.nodes, trace=args.trace, keep=args.keep, overrides=overrides)
        if not ok:
            failed.append(seed)
            print(text, flush=True)
        elif not args.quiet:
            print(f"{text} ({time.perf_counter() - t0:.2f}s)", flush=True)
    total = len(seeds)
    print(
        f"{total - len(failed)}/{total} seeds passed ({args.nodes} nodes) "
        f"in {time.perf_counter() - began:.1f}s"
        + (f"; failed: {' '.join(map(str, failed))}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
