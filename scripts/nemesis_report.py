"""The checks and the report of ``scripts/nemesis.py``.

:func:`analyze` takes what a run left (the clients' op lines, the faults done, the
members' ``describe`` lines, the final state and what the members' logs hold) and
returns the report as a dict (written as ``report.json``); :func:`markdown` turns it
into ``report.md``.  Every check is a section with ``ok``; the run passed when all are.

Checks:

- ``linearizable``: the writes and linearizable queries (``tests/lincheck.py``, per key;
  a failure comes with lincheck's smallest failing window);
- ``follower_reads``: every follower read answered a value written by then
  (:func:`~tests.lincheck.check_follower_reads`), no session's follower reads went back
  in log position (:func:`~tests.lincheck.check_monotonic_reads`), and each saw its own
  session's acknowledged writes (:func:`read_your_writes`);
- ``acknowledged_on_every_member``: every acknowledged write is in every member's log;
- ``converged``: once healed, every member at the same commit, append and applied
  position, the same log bytes, and the same service state (digest);
- ``recovery``: after every heal a write was acknowledged within the bound (the time
  from the heal to the first write acknowledged after it), and the members caught up
  (every member's commit position at the highest one known at the heal).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.lincheck import (
    Op,
    check,
    check_follower_reads,
    check_monotonic_reads,
    format_ops,
)


def load_ops(directory: Path) -> list[dict[str, Any]]:
    """Every op line of every client process, by invocation."""
    ops: list[dict[str, Any]] = []
    for path in sorted(directory.glob("history-*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                ops.append(json.loads(text))
            except ValueError:  # a last line cut short
                pass
    ops.sort(key=lambda op: op["call"])
    return ops


def load_lines(path: Path) -> list[dict[str, Any]]:
    found = []
    if path.exists():
        for text in path.read_text().splitlines():
            try:
                found.append(json.loads(text))
            except ValueError:
                pass
    return found


def to_op(raw: dict[str, Any]) -> Op:
    return Op(
        raw["client"],
        raw["kind"],
        raw["key"],
        tuple(raw["args"]),
        raw["call"],
        raw.get("ret"),
        raw.get("result"),
        raw.get("position"),
        raw.get("consistency", "linearizable"),
    )


def history_of(raw: Iterable[dict[str, Any]]) -> list[Op]:
    """The ops that can tell something: a read that never completed tells nothing."""
    return [to_op(op) for op in raw if op["kind"] == "put" or op.get("ret") is not None]


def read_your_writes(history: Sequence[Op]) -> list[tuple[Op, Op]]:
    """Follower reads that missed their own session's acknowledged write: (the write,
    the read) where the session's latest write of the key completed before the read was
    invoked and the read answered the key absent, or a value whose every write was
    acknowledged before that write was invoked (so it was overwritten by then)."""
    writes: dict[str, list[Op]] = defaultdict(list)
    for op in history:
        if op.kind == "put":
            writes[op.key].append(op)
    missed = []
    for op in history:
        if op.kind != "get" or op.consistency != "follower" or op.ret is None:
            continue
        own = [
            w
            for w in writes[op.key]
            if w.client == op.client and w.ret is not None and w.ret < op.call
        ]
        if not own:
            continue
        mine = max(own, key=lambda w: w.ret or 0.0)
        if op.result == mine.args[0]:
            continue
        givers = [w for w in writes[op.key] if w.args[0] == op.result]
        if op.result is None or all(w.ret is not None and w.ret < mine.call for w in givers):
            missed.append((mine, op))
    return missed


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Timeline:
    """The ops by completion and by invocation, for windows of time (bisect, not scans:
    a 30-minute run has a few hundred thousand ops and a few hundred windows)."""

    def __init__(self, raw: Sequence[dict[str, Any]]) -> None:
        self.done = sorted((op for op in raw if op.get("ret") is not None), key=_ret)
        self.rets = [op["ret"] for op in self.done]
        self.acks = [op["ret"] for op in self.done if op["kind"] == "put"]
        self.given_up = sorted(op["call"] for op in raw if op.get("ret") is None)

    def first_after(self, when: float, writes: bool) -> float | None:
        times = self.acks if writes else self.rets
        i = bisect.bisect_left(times, when)
        return times[i] if i < len(times) else None

    def stats(self, lo: float, hi: float) -> dict[str, Any]:
        """Ops completed in [lo, hi): count, rate, latency p50/p99 (ms), writes, given
        up (invoked in it), the longest stretch with no write acknowledged (s)."""
        done = self.done[bisect.bisect_left(self.rets, lo) : bisect.bisect_left(self.rets, hi)]
        latencies = [(op["ret"] - op["call"]) * 1000 for op in done]
        acks = self.acks[bisect.bisect_left(self.acks, lo) : bisect.bisect_left(self.acks, hi)]
        edges = [lo, *acks, hi]
        span = max(hi - lo, 1e-9)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        given_up = bisect.bisect_left(self.given_up, hi) - bisect.bisect_left(self.given_up, lo)
        return {
            "from": lo,
            "to": hi,
            "ops": len(done),
            "ops_per_s": round(len(done) / span, 1),
            "writes": len(acks),
            "p50_ms": None if p50 is None else round(p50, 1),
            "p99_ms": None if p99 is None else round(p99, 1),
            "given_up": given_up,
            "longest_no_write_s": round(max(b - a for a, b in itertools.pairwise(edges)), 2),
        }


def _ret(op: dict[str, Any]) -> float:
    ret: float = op["ret"]
    return ret


def catch_up(lines: Sequence[dict[str, Any]], heal: float, members: int) -> float | None:
    """Seconds from ``heal`` until every member reported a commit position at least the
    highest any member had reported by the heal (None: not seen)."""
    before = [x["commit"] for x in lines if "commit" in x and x["mt"] <= heal]
    if not before:
        return None
    target = max(before)
    waiting = set(range(members))
    for x in lines:
        if x["mt"] >= heal and x.get("commit", -1) >= target:
            waiting.discard(x["m"])
            if not waiting:
                return float(x["mt"] - heal)
    return None


def analyze(
    raw: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    lines: list[dict[str, Any]],
    final: dict[str, Any],
    logs: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The report (see the module's notes).  ``logs``: ``missing`` (member -> the
    acknowledged writes its log lacks), ``identical`` (the logs agree byte for byte up to
    the shortest), ``sizes``.  Times in the report are seconds after ``settings['origin']``."""
    origin = settings["origin"]
    members = settings["members"]
    bound = settings["recovery_bound"]
    history = history_of(raw)
    result = check(history)
    checks: dict[str, dict[str, Any]] = {}
    failures = []
    for failure in result.failures:
        failures.append(
            {
                "key": failure.key,
                "from_s": round(min(op.call for op in failure.window) - origin, 3),
                "to_s": round(max(op.ret or op.call for op in failure.window) - origin, 3),
                "ops": len(failure.window),
                "needed": len(failure.needed),
                "table": format_ops(failure.window, origin, failure.needed),
                "explain": failure.reason or "no order of the ops marked * explains them",
            }
        )
    checks["linearizable"] = {
        "ok": result.ok,
        "ops": result.ops,
        "keys": result.keys,
        "steps": result.steps,
        "unknown": result.unknown,
        "failures": failures,
    }
    wrong = check_follower_reads(history)
    stale = check_monotonic_reads(history, consistency="follower")
    missed = read_your_writes(history)
    checks["follower_reads"] = {
        "ok": not wrong and not stale and not missed,
        "reads": sum(op.kind == "get" and op.consistency == "follower" for op in history),
        "values_never_written": [format_ops([op], origin) for op in wrong[:5]],
        "went_back": [s.explain(origin) for s in stale[:5]],
        "missed_own_write": [format_ops(pair, origin) for pair in missed[:5]],
        "counts": [len(wrong), len(stale), len(missed)],
    }
    acked = sum(1 for op in raw if op["kind"] == "put" and op.get("ret") is not None)
    missing = logs.get("missing", {})
    checks["acknowledged_on_every_member"] = {
        "ok": acked > 0 and not any(missing.values()),
        "acknowledged": acked,
        "missing": {m: keys[:10] for m, keys in missing.items() if keys},
    }
    converged = final.get("converged") or {}
    digests = {m: d.split()[-1] for m, d in (final.get("digests") or {}).items()}
    member_digests = {m: d for m, d in digests.items() if m != "leader"}
    checks["converged"] = {
        "ok": bool(converged.get("equal"))
        and bool(logs.get("identical"))
        and len(member_digests) == members
        and len(set(digests.values())) == 1,
        "positions": converged,
        "logs_identical": logs.get("identical"),
        "log_sizes": logs.get("sizes"),
        "digests": final.get("digests"),
        "error": final.get("error"),
    }
    recoveries = []
    times = Timeline(raw)
    for fault in faults:
        heal = fault["heal"]
        first_write = times.first_after(heal, writes=True)
        first_any = times.first_after(heal, writes=False)
        recoveries.append(
            {
                "fault": fault["kind"],
                "first_write_s": None if first_write is None else round(first_write - heal, 3),
                "first_op_s": None if first_any is None else round(first_any - heal, 3),
                "catch_up_s": (
                    None if (c := catch_up(lines, heal, members)) is None else round(c, 3)
                ),
            }
        )
    writes = [r["first_write_s"] for r in recoveries]
    ups = [r["catch_up_s"] for r in recoveries]
    checks["recovery"] = {
        "ok": all(w is not None and w <= bound for w in writes)
        and all(c is not None and c <= bound for c in ups),
        "bound_s": bound,
        "max_first_write_s": max((w for w in writes if w is not None), default=None),
        "max_catch_up_s": max((c for c in ups if c is not None), default=None),
        "never": sum(w is None for w in writes) + sum(c is None for c in ups),
    }
    windows = []
    end = settings["end"]
    for i, fault in enumerate(faults):
        before_lo = faults[i - 1]["heal"] if i else settings["began"]
        after_hi = faults[i + 1]["start"] if i + 1 < len(faults) else end
        windows.append(
            {
                "fault": i + 1,
                "kind": fault["kind"],
                "before": times.stats(before_lo, fault["start"]),
                "during": times.stats(fault["start"], fault["heal"]),
                "after": times.stats(fault["heal"], after_hi),
            }
        )
    timeline = []
    for i, fault in enumerate(faults):
        row = dict(fault)
        row["n"] = i + 1
        row["start_s"] = round(fault["start"] - origin, 2)
        row["heal_s"] = round(fault["heal"] - origin, 2)
        row.update(recoveries[i])
        timeline.append(row)
    given_up = sum(1 for op in raw if op.get("ret") is None)
    return {
        "ok": all(c["ok"] for c in checks.values()),
        "settings": settings,
        "ops": {
            "total": len(raw),
            "completed": len(raw) - given_up,
            "given_up": given_up,
            "writes_acknowledged": acked,
            "linearizable_reads": sum(
                1 for op in raw if op["kind"] == "get" and op.get("consistency") != "follower"
            ),
            "follower_reads": sum(1 for op in raw if op.get("consistency") == "follower"),
            "sessions": len({op["client"] for op in raw}),
        },
        "checks": checks,
        "timeline": timeline,
        "windows": windows,
        "whole_run": times.stats(settings["began"], end),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    ops = report["ops"]
    checks = report["checks"]
    out = [
        "# Nemesis run",
        "",
        f"**Verdict: {'PASS' if report['ok'] else 'FAIL'}.** Seed {s['seed']}, "
        f"{s['duration']:g} s asked ({s['ran_s']:.1f} s of faults and load), "
        f"{s['members']} members, {s['clients']} client processes x {s['sessions']} sessions.",
        "",
        f"Ops: {ops['total']} ({ops['writes_acknowledged']} writes acknowledged, "
        f"{ops['linearizable_reads']} linearizable reads, {ops['follower_reads']} follower "
        f"reads, {ops['given_up']} given up), {ops['sessions']} sessions. Whole run: "
        f"{report['whole_run']['ops_per_s']} ops/s, p50 {_ms(report['whole_run']['p50_ms'])} "
        f"ms, p99 {_ms(report['whole_run']['p99_ms'])} ms.",
        "",
    ]
    if s.get("skipped"):
        out += ["Faults skipped: " + "; ".join(f"{k}: {v}" for k, v in s["skipped"].items()), ""]
    out += ["## Checks", "", "| check | verdict | figures |", "| --- | --- | --- |"]
    lin = checks["linearizable"]
    fol = checks["follower_reads"]
    ack = checks["acknowledged_on_every_member"]
    con = checks["converged"]
    rec = checks["recovery"]

    def verdict(c: dict[str, Any]) -> str:
        return "ok" if c["ok"] else "**FAILED**"

    out += [
        f"| linearizable (writes + linearizable queries) | {verdict(lin)} | {lin['ops']} ops on "
        f"{lin['keys']} keys, {lin['steps']} search steps, {len(lin['failures'])} failing keys, "
        f"{len(lin['unknown'])} unknown |",
        f"| follower reads (values written, monotonic, read-your-writes) | {verdict(fol)} | "
        f"{fol['reads']} reads; wrong value / went back / missed own write: "
        f"{' / '.join(map(str, fol['counts']))} |",
        f"| acknowledged writes on every member | {verdict(ack)} | {ack['acknowledged']} "
        f"acknowledged; missing: {ack['missing'] or 'none'} |",
        f"| converged (positions, log bytes, state digest) | {verdict(con)} | "
        f"{con['positions'].get('values', '-')}; logs identical: {con['logs_identical']} |",
        f"| serves again after each heal (bound {rec['bound_s']:g} s) | {verdict(rec)} | max "
        f"first write {_ms(rec['max_first_write_s'])} s, max catch-up "
        f"{_ms(rec['max_catch_up_s'])} s, {rec['never']} never |",
        "",
        "## Faults",
        "",
        "Times in seconds from the start of the load. *first write*: the heal to the first "
        "write acknowledged after it; *catch-up*: the heal to every member's commit position "
        "at the highest known at the heal.",
        "",
        "| # | start | heal | fault | leader | how | first write | catch-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["timeline"]:
        how = row["how"].replace("|", "\\|")  # a split's halves: not a column
        out.append(
            f"| {row['n']} | {row['start_s']:.2f} | {row['heal_s']:.2f} | {row['kind']} | "
            f"{'-' if row['leader'] is None else row['leader']} | {how} | "
            f"{_ms(row['first_write_s'])} | {_ms(row['catch_up_s'])} |"
        )
    out += [
        "",
        "## Around each fault",
        "",
        "Ops completed in the quiet time before the fault, during it, and after the heal "
        "(until the next fault): rate, latency percentiles, writes acknowledged, ops given "
        "up (invoked in the window), the longest time with no write acknowledged.",
        "",
        "| # | fault | window | s | ops/s | p50 ms | p99 ms | writes | given up "
        "| no write for (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for w in report["windows"]:
        for name in ("before", "during", "after"):
            x = w[name]
            out.append(
                f"| {w['fault']} | {w['kind']} | {name} | {x['to'] - x['from']:.1f} | "
                f"{x['ops_per_s']} | {_ms(x['p50_ms'])} | {_ms(x['p99_ms'])} | {x['writes']} | "
                f"{x['given_up']} | {x['longest_no_write_s']} |"
            )
    problems = []
    for failure in lin["failures"]:
        problems += [
            f"### Key {failure['key']!r}: not linearizable",
            "",
            f"The smallest failing window: {failure['ops']} ops from {failure['from_s']} s "
            f"to {failure['to_s']} s ({failure['explain']}; * marks the ops needed):",
            "",
            "```",
            failure["table"],
            "```",
            "",
        ]
    for name, items in (
        ("follower reads of values never written", fol["values_never_written"]),
        ("follower reads that went back", fol["went_back"]),
        ("follower reads that missed their session's own write", fol["missed_own_write"]),
    ):
        if items:
            problems += [f"### {name}", "", "```", *items, "```", ""]
    if lin["unknown"]:
        problems += [f"Keys the checker ran out of budget on: {lin['unknown']}", ""]
    if not ack["ok"]:
        problems += [f"Acknowledged writes missing: {ack['missing']}", ""]
    if not con["ok"]:
        problems += [
            "Not converged: " + json.dumps({k: con[k] for k in ("positions", "digests", "error")}),
            "",
        ]
    if problems:
        out += ["", "## Failures", "", *problems]
    return "\n".join(out) + "\n"
