"""Run the deterministic simulator from the command line: replay one seed, or soak many.

    .venv/bin/python -m tests.sim.run --seed 1234 --nodes 3            # replay one seed
    .venv/bin/python -m tests.sim.run --seed 1234 --nodes 3 --trace    # ...and print its trace
    .venv/bin/python -m tests.sim.run --seeds 5000 --start 0 --nodes 3 --workers 2 --quiet
                                                                       # soak: seeds 0..4999

Exit status 1 if any seed failed; every failure prints its replay command.  ``--workers``
runs seeds in that many worker processes (each one ``python -m tests.sim.run --json``);
the test suite's sweeps use the same :class:`Pool`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from .harness import SimCluster, SimFailure

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SeedResult:
    seed: int
    nodes: int
    ok: bool
    reason: str  # the invariant that broke ("" when ok)
    text: str  # the summary, or the failure with its replay command
    seconds: float  # wall time


def run_seed(
    seed: int,
    nodes: int,
    *,
    trace: bool = False,
    keep: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> SeedResult:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sim-") as tmp:
        base = keep if keep is not None else Path(tmp)
        sim = SimCluster(
            seed, nodes, base, trace=trace, keep_dirs=keep is not None, **(overrides or {})
        )
        try:
            result = sim.run()
            ok, reason, text = True, "", f"{result.summary()} hash {result.trace_hash[:16]}"
        except SimFailure as exc:
            ok, reason, text = False, exc.reason, str(exc)
        if trace:
            print(sim.format_trace(), flush=True)
            print("\n".join(sim.log_lines), flush=True)
    return SeedResult(seed, nodes, ok, reason, text, time.perf_counter() - began)


def _override_flags(overrides: dict[str, Any]) -> list[str]:
    flags = []
    if "safety_duration" in overrides:
        flags += ["--safety", str(overrides["safety_duration"])]
    if "clock_overshoot" in overrides:
        flags += ["--clock-overshoot", str(overrides["clock_overshoot"])]
    return flags


class Pool:
    """Runs ``(seed, nodes)`` jobs in worker processes; results come back in any order.

    Job ``i`` goes to worker ``i % workers``, and each worker runs its jobs in order, so
    asking for the results in job order keeps every worker busy.
    """

    def __init__(
        self,
        jobs: Sequence[tuple[int, int]],
        workers: int,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.jobs = list(jobs)
        self.results: dict[tuple[int, int], SeedResult] = {}
        self.owner: dict[tuple[int, int], int] = {}
        self._procs: list[subprocess.Popen[str]] = []
        self._errors: list[IO[str]] = []
        workers = max(1, min(workers, len(self.jobs)))
        for w in range(workers):
            mine = self.jobs[w::workers]
            for job in mine:
                self.owner[job] = w
            err = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close())
            self._errors.append(err)
            self._procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.sim.run",
                        "--json",
                        "--jobs",
                        ",".join(f"{seed}:{nodes}" for seed, nodes in mine),
                        *_override_flags(overrides or {}),
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )

    def result(self, seed: int, nodes: int) -> SeedResult:
        """Wait for the result of one job."""
        job = (seed, nodes)
        w = self.owner[job]
        proc = self._procs[w]
        while job not in self.results:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                err = self._errors[w]
                err.seek(0)
                tail = err.read()[-3000:]
                raise RuntimeError(
                    f"simulator worker {w} exited ({proc.returncode}) before seed {seed} "
                    f"({nodes} nodes):\n{tail}"
                )
            if not line.startswith("{"):
                continue
            data = json.loads(line)
            self.results[(data["seed"], data["nodes"])] = SeedResult(**data)
        return self.results[job]

    def __iter__(self) -> Iterator[SeedResult]:
        for seed, nodes in self.jobs:
            yield self.result(seed, nodes)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        for err in self._errors:
            err.close()


def _parse_jobs(text: str) -> list[tuple[int, int]]:
    jobs = []
    for part in filter(None, text.split(",")):
        seed, _, nodes = part.partition(":")
        jobs.append((int(seed), int(nodes or 3)))
    return jobs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (soak)")
    parser.add_argument("--start", type=int, default=0, help="first seed of a soak")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--jobs", type=_parse_jobs, help="SEED:NODES,... to run instead")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--trace", action="store_true", help="print the run's trace")
    parser.add_argument("--keep", type=Path, help="keep node directories under this path")
    parser.add_argument("--safety", type=float, help="safety phase duration (virtual s)")
    parser.add_argument(
        "--clock-overshoot",
        type=float,
        metavar="SECONDS",
        help="autojump this far past each deadline (default 0: exactly onto it)",
    )
    parser.add_argument("--quiet", action="store_true", help="print failures only")
    parser.add_argument("--json", action="store_true", help="one JSON result per line")
    args = parser.parse_args(argv)
    if args.jobs is not None:
        jobs = args.jobs
    elif args.seed is not None:
        jobs = [(args.seed, args.nodes)]
    else:
        jobs = [(seed, args.nodes) for seed in range(args.start, args.start + args.seeds)]
    overrides: dict[str, Any] = {}
    if args.safety is not None:
        overrides["safety_duration"] = args.safety
    if args.clock_overshoot is not None:
        overrides["clock_overshoot"] = args.clock_overshoot
    began = time.perf_counter()
    pool = None
    if args.workers > 1 and len(jobs) > 1 and not args.trace:
        pool = Pool(jobs, args.workers or os.cpu_count() or 1, overrides)
        results: Iterator[SeedResult] = iter(pool)
    else:
        results = (
            run_seed(seed, nodes, trace=args.trace, keep=args.keep, overrides=overrides)
            for seed, nodes in jobs
        )
    failed: list[SeedResult] = []
    try:
        for result in results:
            if not result.ok:
                failed.append(result)
            if args.json:
                print(json.dumps(asdict(result)), flush=True)
            elif not result.ok:
                print(result.text, flush=True)
            elif not args.quiet:
                print(f"{result.text} ({result.seconds:.2f}s)", flush=True)
    finally:
        if pool is not None:
            pool.close()
    if not args.json:
        print(
            f"{len(jobs) - len(failed)}/{len(jobs)} seeds passed in "
            f"{time.perf_counter() - began:.1f}s"
            + ("; failed: " + " ".join(f"{r.seed}:{r.nodes}" for r in failed) if failed else ""),
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
