"""The report: aggregates, the cross-member consistency check, the summary and the plot.

Consistency: the members' saved commit positions (``node-state.json``) are lower bounds
of what each had committed, so every member must hold the same entries (same position,
length and CRC of the body) in ``[start, lowest commit position)``, ``start`` being the
highest first position of the members' archives (0 unless a log was cut at the front).
A position where a member has no entry, a different one, or bytes skipped as corrupt is a
divergence.  The reference value at a position is the one most members hold (ties go to
the member with the highest commit position).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .source import MemberArchive, Problem

__all__ = ["build", "check_consistency", "encode", "plot_throughput", "summary"]

MESSAGE = "SessionMessageHeader"
MAX_BUCKETS = 600
"""Throughput is counted in buckets of the shortest of :data:`BUCKETS_MS` (then whole
minutes) that gives at most this many."""
BUCKETS_MS = (100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000)
MAX_LISTED_SESSIONS = 1000
MAX_LISTED_ACTIONS = 1000
ACTION_COLOURS = {"SUSPEND": "tab:orange", "RESUME": "tab:green", "SNAPSHOT": "tab:purple",
                  "SHUTDOWN": "tab:red", "ABORT": "tab:red"}  # fmt: skip


def _iso(timestamp_ms: int | None) -> str | None:
    if timestamp_ms is None:
        return None
    moment = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------- consistency


def _describe_value(row: Any) -> str:
    parts = [f"{row['type']}", f"length {row['length']}", f"crc {int(row['crc']):#010x}"]
    if row["term"] is not None:
        parts.append(f"term {row['term']}")
    if row["cluster_session_id"] is not None:
        parts.append(f"session {row['cluster_session_id']}")
    if row["timestamp"] is not None:
        parts.append(f"timestamp {row['timestamp']}")
    if row["payload_size"] is not None:
        parts.append(f"payload {row['payload_size']} bytes")
    return ", ".join(parts)


_COMPARED = ("type", "term", "cluster_session_id", "timestamp", "payload_size", "correlation_id",
             "close_reason", "action", "leader_member_id", "base_position")  # fmt: skip


def _difference(found: Any, expected: Any, reference_members: list[str]) -> str:
    fields = [
        f"{name} {found[name]!r} instead of {expected[name]!r}"
        for name in _COMPARED
        if found[name] != expected[name]
    ]
    if found["length"] != expected["length"]:
        fields.append(f"body length {found['length']} instead of {expected['length']}")
    if not fields:
        fields.append("the body bytes differ (same decoded header fields)")
    crc = f"crc {int(found['crc']):#010x} instead of {int(expected['crc']):#010x}"
    return f"entry differs from {', '.join(reference_members)}: {'; '.join(fields)} ({crc})"


def check_consistency(
    entries: DataFrame,
    members: Sequence[MemberArchive],
    problems: Sequence[Problem],
    max_divergences: int,
) -> dict[str, Any]:
    """Compare the members' entries up to the lowest saved commit position."""
    # An empty archive counts when its node-state says it had committed entries.
    present = [m for m in members if m.segments or m.commit_position > 0]
    start = max((m.start_position for m in present), default=0)
    end = min((m.commit_position for m in present), default=0)
    result: dict[str, Any] = {
        "members": [m.name for m in present],
        "commit_positions": {m.name: m.commit_position for m in members},
        "checked_from": start,
        "checked_to": end,
        "rule": (
            "entries at positions in [checked_from, checked_to) must have the same length "
            "and CRC on every member; checked_to is the lowest of the members' commit "
            "positions, each the highest of the one saved in its node-state.json and its "
            "latest snapshot's position in recording.log (each a lower bound of the "
            "cluster's commit position)"
        ),
        "positions_checked": 0,
        "divergent_positions": 0,
        "divergences": [],
        "listed": 0,
    }
    missing_state = [m.name for m in present if not m.has_node_state]
    if missing_state:
        result["note"] = (
            f"no node-state.json for {', '.join(missing_state)}: commit position taken as 0"
        )
    if len(present) < 2 or end <= start:
        result["consistent"] = True
        if len(present) < 2:
            result["note"] = "fewer than two members read: nothing to compare"
        return result
    n = len(present)
    window = entries.filter((F.col("position") >= start) & (F.col("position") < end))
    per_position = window.groupBy("position").agg(
        F.count("*").alias("copies"),
        F.countDistinct("crc", "length").alias("values"),
    )
    divergent = (F.col("copies") != n) | (F.col("values") > 1)
    totals = per_position.agg(
        F.count("*").alias("positions"), F.count(F.when(divergent, 1)).alias("divergent")
    ).collect()[0]
    result["positions_checked"] = int(totals["positions"] or 0)
    result["divergent_positions"] = int(totals["divergent"] or 0)
    divergences: list[dict[str, Any]] = []
    if result["divergent_positions"]:
        first = per_position.filter(divergent).orderBy("position").limit(max_divergences)
        rows = window.join(first.select("position"), "position").collect()
        by_position: dict[int, dict[str, Any]] = {}
        for row in rows:
            by_position.setdefault(int(row["position"]), {})[row["member"]] = row
        rank = {
            m.name: i
            for i, m in enumerate(sorted(present, key=lambda m: (-m.commit_position, m.name)))
        }
        skipped = [p for p in problems if p.skipped_bytes > 0]
        for position in sorted(by_position):
            held = by_position[position]
            votes = Counter((int(r["crc"]), int(r["length"])) for r in held.values())
            best = max(votes.values())
            winners = [v for v, c in votes.items() if c == best]
            reference_member = min(
                (name for name, r in held.items() if (int(r["crc"]), int(r["length"])) in winners),
                key=rank.__getitem__,
            )
            expected = held[reference_member]
            key = (int(expected["crc"]), int(expected["length"]))
            agreeing = sorted(
                (name for name, r in held.items() if (int(r["crc"]), int(r["length"])) == key),
                key=rank.__getitem__,
            )
            for member in sorted(present, key=lambda m: rank[m.name]):
                found_row = held.get(member.name)
                if (
                    found_row is not None
                    and (
                        int(found_row["crc"]),
                        int(found_row["length"]),
                    )
                    == key
                ):
                    continue
                if found_row is None:
                    cause = next(
                        (
                            p
                            for p in skipped
                            if p.member == member.name
                            and p.position <= position < p.position + p.skipped_bytes
                        ),
                        None,
                    )
                    if cause is not None:
                        what = f"unreadable (skipped as corrupt: {cause.reason})"
                    else:
                        what = (
                            f"missing: no entry starts at this position (expected "
                            f"{_describe_value(expected)}, held by {', '.join(agreeing)})"
                        )
                    found = None
                else:
                    what = _difference(found_row, expected, agreeing)
                    found = _describe_value(found_row)
                divergences.append(
                    {
                        "member": member.name,
                        "position": position,
                        "what": what,
                        "expected": _describe_value(expected),
                        "found": found,
                    }
                )
    result["divergences"] = divergences
    result["listed"] = len(divergences)
    result["consistent"] = result["divergent_positions"] == 0
    return result


# ---------------------------------------------------------------------- aggregates


def _throughput(canonical: DataFrame, bounds: tuple[int, int] | None) -> dict[str, Any]:
    """Committed entries and client messages per time bucket; ``bounds`` = the first and
    last committed timestamps."""
    if bounds is None:
        return {"bucket_seconds": 1.0, "series": [], "peak_messages_per_second": 0.0}
    committed = canonical.filter(F.col("committed") & F.col("timestamp").isNotNull())
    lo, hi = bounds
    span_ms = hi - lo + 1
    bucket_ms = next(
        (b for b in BUCKETS_MS if span_ms / b <= MAX_BUCKETS),
        math.ceil(span_ms / MAX_BUCKETS / 60_000) * 60_000,
    )
    rows = (
        committed.groupBy(F.floor((F.col("timestamp") - lo) / bucket_ms).alias("bucket"))
        .agg(
            F.count("*").alias("entries"),
            F.count(F.when(F.col("type") == MESSAGE, 1)).alias("messages"),
        )
        .orderBy("bucket")
        .collect()
    )
    seconds = bucket_ms / 1000
    counts = {int(r["bucket"]): (int(r["entries"]), int(r["messages"])) for r in rows}
    last = max(counts, default=-1)
    series: list[dict[str, Any]] = []
    peak = 0.0
    for bucket in range(last + 1):  # empty buckets too: a failover shows as a gap
        entries, messages = counts.get(bucket, (0, 0))
        peak = max(peak, messages / seconds)
        series.append(
            {
                "t": bucket * seconds,
                "time": _iso(lo + bucket * bucket_ms),
                "entries": entries,
                "messages": messages,
                "messages_per_second": round(messages / seconds, 3),
            }
        )
    span = (hi - lo) / 1000
    total_messages = sum(m for _, m in counts.values())
    return {
        "bucket_seconds": seconds,
        "from": _iso(lo),
        "to": _iso(hi),
        "span_seconds": span,
        "peak_messages_per_second": round(peak, 3),
        "mean_messages_per_second": round(total_messages / span, 3) if span > 0 else None,
        "series": series,
    }


def _session_summary(sessions: DataFrame) -> dict[str, Any]:
    stats = sessions.agg(
        F.count("*").alias("count"),
        F.count("closed_timestamp").alias("closed"),
        F.min("duration_ms").alias("min"),
        F.percentile_approx("duration_ms", [0.5, 0.9, 0.99]).alias("percentiles"),
        F.max("duration_ms").alias("max"),
        F.avg("duration_ms").alias("mean"),
    ).collect()[0]
    reasons = {
        (r["close_reason"] or "STILL_OPEN"): int(r["count"])
        for r in sessions.groupBy("close_reason").count().collect()
    }
    percentiles = stats["percentiles"] or [None, None, None]
    listed = (
        sessions.orderBy(F.desc("message_count"), "cluster_session_id")
        .limit(MAX_LISTED_SESSIONS)
        .collect()
    )
    return {
        "count": int(stats["count"]),
        "closed": int(stats["closed"]),
        "close_reasons": dict(sorted(reasons.items())),
        "duration_ms": {
            "min": stats["min"],
            "p50": percentiles[0],
            "p90": percentiles[1],
            "p99": percentiles[2],
            "max": stats["max"],
            "mean": round(stats["mean"], 3) if stats["mean"] is not None else None,
        },
        "messages_per_session": [
            {
                "cluster_session_id": int(r["cluster_session_id"]),
                "messages": int(r["message_count"]),
                "payload_bytes": int(r["payload_bytes"]),
                "opened": _iso(r["opened_timestamp"]),
                "closed": _iso(r["closed_timestamp"]),
                "duration_ms": r["duration_ms"],
                "close_reason": r["close_reason"],
                "principal": r["principal"],
                "response_channel": r["response_channel"],
            }
            for r in listed
        ],
        "listed": len(listed),
    }


def build(
    spark: SparkSession,
    *,
    members: Sequence[MemberArchive],
    entries: DataFrame,
    canonical: DataFrame,
    sessions: DataFrame,
    terms: DataFrame,
    actions: DataFrame,
    problems: Sequence[Problem],
    max_divergences: int,
) -> dict[str, Any]:
    """The report document (JSON-ready)."""
    per_member = {
        r["member"]: {"entries": int(r["entries"]), "committed": int(r["committed"])}
        for r in entries.groupBy("member")
        .agg(
            F.count("*").alias("entries"), F.count(F.when(F.col("committed"), 1)).alias("committed")
        )
        .collect()
    }
    archives = []
    for member in members:
        described = member.describe()
        described.update(per_member.get(member.name, {"entries": 0, "committed": 0}))
        archives.append(described)
    timed = F.col("committed") & F.col("timestamp").isNotNull()
    type_rows = (
        canonical.groupBy("type")
        .agg(
            F.count("*").alias("count"),
            F.count(F.when(F.col("committed"), 1)).alias("committed"),
            F.count(F.when(F.col("cluster_session_id") < 0, 1)).alias("service"),
            F.min(F.when(timed, F.col("timestamp"))).alias("lo"),
            F.max(F.when(timed, F.col("timestamp"))).alias("hi"),
        )
        .collect()
    )
    by_type = {r["type"]: int(r["count"]) for r in type_rows}
    canonical_committed = sum(int(r["committed"]) for r in type_rows)
    service_messages = sum(int(r["service"]) for r in type_rows if r["type"] == MESSAGE)
    los = [int(r["lo"]) for r in type_rows if r["lo"] is not None]
    his = [int(r["hi"]) for r in type_rows if r["hi"] is not None]
    bounds = (min(los), max(his)) if los else None
    consistency = check_consistency(entries, members, problems, max_divergences)
    term_rows = terms.orderBy("term").collect()
    return {
        "generated_at": _iso(int(dt.datetime.now(tz=dt.UTC).timestamp() * 1000)),
        "consistent": consistency["consistent"],
        "divergences": consistency["divergences"],
        "consistency": {k: v for k, v in consistency.items() if k != "divergences"},
        "skipped": [
            {
                "member": p.member,
                "file": p.file,
                "position": p.position,
                "skipped_bytes": p.skipped_bytes,
                "reason": p.reason,
            }
            for p in problems
        ],
        "archives": archives,
        "commit_position": {
            "lowest": min((m.commit_position for m in members), default=0),
            "highest": max((m.commit_position for m in members), default=0),
        },
        "log": {
            "end_position": max((m.end_position for m in members), default=0),
            "entries": sum(by_type.values()),
            "committed_entries": canonical_committed,
            "by_type": dict(sorted(by_type.items())),
            "messages": by_type.get(MESSAGE, 0),
            "service_messages": service_messages,
        },
        "messages_per_term": [
            {
                "term": int(r["term"]),
                "leader": r["leader"],
                "base_position": r["base_position"],
                "end_position": r["end_position"],
                "start": _iso(r["start_timestamp"]),
                "entries": int(r["entries"]),
                "messages": int(r["messages"]),
                "recording_log_members": list(r["recording_log_members"]),
            }
            for r in term_rows
        ],
        "sessions": _session_summary(sessions),
        "admin_actions": [
            {
                "position": int(r["position"]),
                "term": r["term"],
                "action": r["action"],
                "flags": r["flags"],
                "time": _iso(r["timestamp"]),
                "committed": bool(r["committed"]),
            }
            for r in actions.orderBy("position").limit(MAX_LISTED_ACTIONS).collect()
        ],
        "throughput": _throughput(canonical, bounds),
    }


# ---------------------------------------------------------------------- output


def encode(document: dict[str, Any]) -> bytes:
    """``report.json``'s bytes."""
    return (json.dumps(document, indent=2, sort_keys=False) + "\n").encode()


def _seconds_since(origin: float, iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() - origin


def plot_throughput(document: dict[str, Any]) -> bytes:
    """PNG of committed messages (and all entries) per second, term starts and admin
    actions marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput = document["throughput"]
    series = throughput["series"]
    seconds = throughput["bucket_seconds"]
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=100, layout="constrained")
    try:
        xs = [s["t"] for s in series]
        ax.step(xs, [s["entries"] / seconds for s in series], where="post", label="log entries/s")
        ax.step(
            xs, [s["messages_per_second"] for s in series], where="post", label="client messages/s"
        )
        start = throughput.get("from")
        if start is not None:
            _mark_events(ax, document, _seconds_since(0.0, start))
        ax.set_xlabel(f"seconds since {start or 'start'} (buckets of {seconds:g} s)")
        ax.set_ylabel("per second")
        ax.set_title("Committed throughput")
        fig.legend(loc="outside right upper", fontsize=8)
        ax.grid(alpha=0.3)
        png = io.BytesIO()
        fig.savefig(png, format="png")
        return png.getvalue()
    finally:
        plt.close(fig)


def _mark_events(ax: Any, document: dict[str, Any], origin: float) -> None:
    """Vertical lines at term starts (grey, dotted) and admin actions (coloured, dashed),
    each kind in the legend; marks closer than 1.5% of the time axis share one label."""
    from matplotlib.lines import Line2D

    marks = sorted(
        [
            (_seconds_since(origin, t["start"]), f"term {t['term']} (leader {t['leader']})",
             "grey", ":")
            for t in document["messages_per_term"]
            if t["start"] is not None
        ]
        + [
            (_seconds_since(origin, a["time"]), a["action"],
             ACTION_COLOURS.get(a["action"], "black"), "--")
            for a in document["admin_actions"]
            if a["time"] is not None
        ]
    )  # fmt: skip
    if not marks:
        return
    span = max(document["throughput"].get("span_seconds") or 0.0, marks[-1][0], 1e-9)
    groups: list[list[tuple[float, str, str, str]]] = []
    for mark in marks:
        if groups and mark[0] - groups[-1][0][0] < 0.015 * span:
            groups[-1].append(mark)
        else:
            groups.append([mark])
    for group in groups:
        for at, _, colour, style in group:
            ax.axvline(at, color=colour, linestyle=style, linewidth=1)
        colours = {colour for _, _, colour, _ in group}
        ax.annotate(
            ", ".join(label for _, label, _, _ in group),
            (group[0][0], 0.99),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=colours.pop() if len(colours) == 1 else "black",
        )
    styles = {style for _, _, _, style in marks}
    if ":" in styles:
        ax.add_line(Line2D([], [], color="grey", linestyle=":", linewidth=1, label="term start"))
    if "--" in styles:
        ax.add_line(Line2D([], [], color="black", linestyle="--", lw=1, label="admin action"))


def summary(document: dict[str, Any]) -> str:
    """The readable summary printed on stdout."""
    lines: list[str] = []
    log = document["log"]
    lines.append(
        f"log: {log['entries']} entries up to position {log['end_position']} "
        f"({log['committed_entries']} committed), {log['messages']} client messages, "
        f"{log['service_messages']} service messages"
    )
    lines.append("  by type: " + ", ".join(f"{k} {v}" for k, v in log["by_type"].items()))
    lines.append("members:")
    for a in document["archives"]:
        lines.append(
            f"  {a['member']}: {a['entries']} entries in {a['segments']} segment(s), "
            f"log [{a['start_position']}, {a['end_position']}), "
            f"commit position {a['commit_position']} ({a['directory']})"
        )
    lines.append("terms:")
    for t in document["messages_per_term"]:
        recorded = ",".join(t["recording_log_members"]) or "-"
        lines.append(
            f"  term {t['term']}: leader {t['leader']}, positions [{t['base_position']}, "
            f"{t['end_position']}), from {t['start']}, {t['messages']} messages / "
            f"{t['entries']} entries (recording logs: {recorded})"
        )
    sessions = document["sessions"]
    lines.append(
        f"sessions: {sessions['count']} ({sessions['closed']} closed; "
        + ", ".join(f"{k} {v}" for k, v in sessions["close_reasons"].items())
        + ")"
    )
    d = sessions["duration_ms"]
    if d["min"] is not None:
        lines.append(
            f"  duration ms: min {d['min']}, p50 {d['p50']}, p90 {d['p90']}, max {d['max']}"
        )
    shown = sessions["messages_per_session"][:10]
    for s in shown:
        lines.append(
            f"  session {s['cluster_session_id']}: {s['messages']} messages, "
            f"{s['payload_bytes']} payload bytes, closed {s['close_reason'] or '-'}, "
            f"principal {s['principal'] or '-'}, response channel "
            f"{s['response_channel'] or '(the ingress connection)'}"
        )
    if sessions["count"] > len(shown):
        lines.append(f"  ... {sessions['count'] - len(shown)} more in report.json / sessions")
    actions = document["admin_actions"]
    if actions:
        lines.append(
            "admin actions: "
            + ", ".join(
                f"{a['action']} at {a['position']} ({a['time']}"
                + ("" if a["committed"] else ", not committed")
                + ")"
                for a in actions
            )
        )
    th = document["throughput"]
    if th["series"]:
        lines.append(
            f"throughput: {th['span_seconds']:.1f} s from {th['from']}, mean "
            f"{th['mean_messages_per_second']} msg/s, peak {th['peak_messages_per_second']} msg/s "
            f"(buckets of {th['bucket_seconds']:g} s)"
        )
    c = document["consistency"]
    verdict = "CONSISTENT" if document["consistent"] else "NOT CONSISTENT"
    lines.append(
        f"consistency: {verdict}: {c['positions_checked']} positions in "
        f"[{c['checked_from']}, {c['checked_to']}) compared across {len(c['members'])} members, "
        f"{c['divergent_positions']} divergent"
    )
    if c.get("note"):
        lines.append(f"  note: {c['note']}")
    for div in document["divergences"][:20]:
        lines.append(f"  {div['member']} @ {div['position']}: {div['what']}")
    if c["divergent_positions"] and len(document["divergences"]) > 20:
        lines.append(f"  ... see report.json ({c['listed']} listed)")
    if document["skipped"]:
        lines.append(f"skipped (--skip-corrupt): {len(document['skipped'])}")
        for p in document["skipped"]:
            lines.append(
                f"  {p['member']}: {p['file']} at position {p['position']}: "
                f"{p['skipped_bytes']} bytes: {p['reason']}"
            )
    if "tables" in document:
        first = next(iter(document["tables"].values()))
        out = first.rsplit("/", 1)[0]
        names = ",".join(document["tables"])
        lines.append(f"written: {out}/{{{names}}} (Parquet, partitioned by "
                     f"{document.get('partitioned_by')}), report.json"
                     + (", throughput.png" if "plot" in document else ""))  # fmt: skip
    return "\n".join(lines)
