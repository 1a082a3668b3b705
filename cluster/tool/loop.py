"""``cluster-tool timings`` and ``cluster-tool stalls``: how long a member's work takes
(its latency histograms) and when its event loop stopped turning (the stall finder), from
each member's ``describe``.  Shapes in ``docs/cluster-tool.md``, as for every command."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..metrics import bucket_quantile
from ..protocol.admin import HistogramStatus
from .client import Result
from .render import cell, down, iso, short_time, table

SUMMARY_KEYS = ("count", "mean_s", "p50_s", "p99_s")
"""A histogram's summary in ``timings``: values since the member started; each quantile
is the upper bound of its bucket (buckets double from 10 µs)."""
TIMINGS_KEYS = (
    "member_id", "reachable", "error", "role", "fsync", "duty_cycle", "commit", "replication",
    "stall",
)  # fmt: skip
STALLS_KEYS = ("member_id", "reachable", "error", "threshold_s", "busy", "late", "recent")
STALL_KEYS = ("at", "at_iso", "kind", "duration_s", "cpu_s", "gc_s", "where")


def summary(h: HistogramStatus | None) -> dict[str, Any] | None:
    if h is None:
        return None
    return {
        "count": h.count,
        "mean_s": h.sum / h.count if h.count else None,
        "p50_s": bucket_quantile(h.bounds, h.counts, 0.5),
        "p99_s": bucket_quantile(h.bounds, h.counts, 0.99),
    }


def timings_member(r: Result) -> dict[str, Any]:
    """One member of ``timings --output json``; ``commit`` and ``replication`` (by
    follower id) are a leader's, null and empty elsewhere."""
    item: dict[str, Any] = dict.fromkeys(TIMINGS_KEYS)
    item.update(member_id=r.member.member_id, reachable=r.status is not None, replication={})
    s = r.status
    if s is None:
        item["error"] = r.failure or "no answer"
        return item
    item["role"] = s.role
    by_name = {h.name: h for h in s.histograms if h.name != "replication"}
    for name in ("fsync", "duty_cycle", "commit", "stall"):
        h = by_name.get(name)
        item[name] = summary(h) if h is not None and (h.count or name != "commit") else None
    item["replication"] = {
        h.labels.get("follower", "?"): summary(h) for h in s.histograms if h.name == "replication"
    }
    return item


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _pair(s: Mapping[str, Any] | None, first: str = "mean_s") -> str:
    if not s or not s["count"]:
        return "-"
    return f"{_ms(s[first])} / {_ms(s['p99_s'])}"


def timings_table(items: Sequence[Mapping[str, Any]]) -> str:
    header = (
        "member", "role", "fsync ms mean/p99", "cycle ms mean/p99", "commit ms p50/p99",
        "replication lag ms p99", "stalls",
    )  # fmt: skip
    rows = []
    for item in items:
        if not item["reachable"]:
            rows.append((str(item["member_id"]), *("-",) * 5, down(item["error"])))
            continue
        replication = ", ".join(
            f"{f}: {_ms(s['p99_s'])}" for f, s in sorted(item["replication"].items())
        )
        rows.append(
            (
                str(item["member_id"]),
                item["role"],
                _pair(item["fsync"]),
                _pair(item["duty_cycle"]),
                _pair(item["commit"], "p50_s"),
                replication or "-",
                cell(item["stall"]["count"] if item["stall"] else None),
            )
        )
    return (
        table(header, rows) + "\nsince each member started; a quantile is its bucket's upper "
        "bound (buckets double from 10 µs)"
    )


def stalls_member(r: Result) -> dict[str, Any]:
    """One member of ``stalls --output json``: its threshold (0: off), the stalls counted
    since it started by kind, and the most recent ones."""
    item: dict[str, Any] = dict.fromkeys(STALLS_KEYS)
    item.update(member_id=r.member.member_id, reachable=r.status is not None, recent=[])
    s = r.status
    if s is None:
        item["error"] = r.failure or "no answer"
        return item
    st = s.stalls
    item.update(threshold_s=st.threshold_s, busy=st.busy, late=st.late)
    item["recent"] = [
        {
            "at": x.at,
            "at_iso": iso(x.at),
            "kind": x.kind,
            "duration_s": x.duration_s,
            "cpu_s": x.cpu_s,
            "gc_s": x.gc_s,
            "where": x.where,
        }
        for x in st.recent
    ]
    return item


def stalls_heading(item: Mapping[str, Any]) -> str:
    tag = f"member {item['member_id']}"
    if not item["reachable"]:
        return f"{tag}: {down(item['error'])}"
    if not item["threshold_s"]:
        return f"{tag}: stall finder off (--stall-threshold 0)"
    return (
        f"{tag}: {item['busy']} busy passes and {item['late']} late wake-ups over "
        f"{item['threshold_s'] * 1e3:g} ms since it started"
    )


def stalls_table(item: Mapping[str, Any]) -> str:
    header = ("at (UTC)", "kind", "ms", "cpu ms", "gc ms", "where (innermost first)")
    return table(
        header,
        [
            (
                short_time(x["at"]),
                x["kind"],
                _ms(x["duration_s"]),
                _ms(x["cpu_s"]) if x["kind"] == "busy" and x["cpu_s"] >= 0 else "-",
                _ms(x["gc_s"]) if x["kind"] == "busy" else "-",
                x["where"] or "-",
            )
            for x in item["recent"]
        ],
    )
