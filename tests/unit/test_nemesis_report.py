"""The checks of ``scripts/nemesis_report.py`` on hand-written histories: read-your-writes
of follower reads, the windows around a fault, the catch-up time, and a whole report
that passes and one that fails (with the failing window in the markdown)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from nemesis_report import (  # noqa: E402
    Timeline,
    analyze,
    catch_up,
    history_of,
    markdown,
    read_your_writes,
)


def op(
    client: str, kind: str, key: str, call: float, ret: float | None, **more: Any
) -> dict[str, Any]:
    found: dict[str, Any] = {"client": client, "kind": kind, "key": key, "call": call, "ret": ret}
    found["args"] = [more.pop("value")] if kind == "put" else []
    found.update(more)
    return found


def put(client: str, key: str, value: str, call: float, ret: float | None) -> dict[str, Any]:
    return op(client, "put", key, call, ret, value=value)


def get(
    client: str,
    key: str,
    result: str | None,
    call: float,
    ret: float | None,
    level: str = "linearizable",
    position: int | None = None,
) -> dict[str, Any]:
    return op(client, "get", key, call, ret, result=result, consistency=level, position=position)


def test_a_follower_read_that_misses_its_own_write_is_caught() -> None:
    raw = [
        put("a", "k", "a-1", 0.0, 1.0),
        put("b", "k", "b-1", 1.5, 2.0),  # after a-1: a's read may see it
        put("a", "k", "a-2", 3.0, 4.0),
        get("a", "k", "a-2", 5.0, 5.1, "follower"),  # its own write: fine
        get("a", "k", "b-1", 6.0, 6.1, "follower"),  # b-1 was overwritten by a-2 by then
        get("b", "k", "a-2", 6.0, 6.1, "follower"),  # newer than b's own write: fine
        get("b", "k", "a-1", 7.0, 7.1, "follower"),  # a-1 was done before b-1 began
    ]
    missed = read_your_writes(history_of(raw))
    assert [(w.args[0], r.call, r.client) for w, r in missed] == [
        ("a-2", 6.0, "a"),
        ("b-1", 7.0, "b"),
    ]


def test_a_follower_read_may_see_a_write_concurrent_with_its_own() -> None:
    raw = [
        put("b", "k", "b-1", 2.5, 3.5),  # concurrent with a-2: either order
        put("a", "k", "a-2", 3.0, 4.0),
        get("a", "k", "b-1", 5.0, 5.1, "follower"),
    ]
    assert read_your_writes(history_of(raw)) == []
    raw.append(get("a", "k", None, 6.0, 6.1, "follower"))  # absent after its own write
    assert len(read_your_writes(history_of(raw))) == 1


def test_windows_count_ops_latency_and_the_longest_gap_without_a_write() -> None:
    raw = [
        put("a", "k", "1", 0.0, 0.1),
        get("a", "k", "1", 0.2, 0.3),
        put("a", "k", "2", 0.4, 4.0),  # waited out the fault
        put("b", "k", "3", 0.5, None),  # given up
        get("b", "k", "2", 4.1, 4.2),
    ]
    times = Timeline(raw)
    during = times.stats(1.0, 3.0)
    assert (during["ops"], during["writes"], during["longest_no_write_s"]) == (0, 0, 2.0)
    before = times.stats(0.0, 1.0)
    assert (before["ops"], before["writes"], before["given_up"]) == (2, 1, 1)
    assert before["p50_ms"] == 100.0
    assert times.first_after(3.0, writes=True) == 4.0
    assert times.first_after(4.05, writes=True) is None
    assert times.first_after(4.05, writes=False) == 4.2


def test_catch_up_is_when_the_last_member_reaches_the_commit_known_at_the_heal() -> None:
    lines = [
        {"mt": 1.0, "m": 0, "commit": 100},
        {"mt": 1.0, "m": 1, "commit": 100},
        {"mt": 1.5, "m": 2, "commit": 40},  # cut off
        {"mt": 2.1, "m": 0, "commit": 120},
        {"mt": 2.2, "m": 2, "commit": 90},
        {"mt": 2.5, "m": 1, "commit": 120},
        {"mt": 3.4, "m": 2, "commit": 100},
    ]
    assert catch_up(lines, 2.0, 3) == 3.4 - 2.0
    assert catch_up(lines[:5], 2.0, 3) is None


def settings() -> dict[str, Any]:
    return {
        "seed": 1, "duration": 10.0, "members": 3, "clients": 1, "sessions": 2,
        "recovery_bound": 5.0, "origin": 0.0, "began": 0.0, "end": 10.0, "ran_s": 10.0,
    }  # fmt: skip


def final() -> dict[str, Any]:
    positions = [500, 500, 500]
    return {
        "converged": {"equal": True, "values": {"0": positions, "1": positions, "2": positions}},
        "digests": {"leader": "0 500 3 abc", "0": "500 3 abc", "1": "500 3 abc", "2": "500 3 abc"},
    }


FAULT = {"kind": "isolate-leader", "targets": [0], "how": "port down", "leader": 0,
         "start": 2.0, "heal": 5.0, "groups": []}  # fmt: skip
LINES = [{"mt": 1.9, "m": m, "commit": 300} for m in range(3)] + [
    {"mt": 5.5, "m": m, "commit": 400} for m in range(3)
]


def test_a_report_that_passes_and_one_that_fails_with_its_window() -> None:
    raw = [
        put("a", "k", "1", 0.0, 1.0),
        get("b", "k", "1", 1.5, 1.6),
        put("a", "k", "2", 3.0, 5.2),
        get("b", "k", "2", 6.0, 6.1),
        get("b", "k", "2", 6.2, 6.3, "follower", position=400),
    ]
    logs: dict[str, Any] = {
        "missing": {"0": [], "1": [], "2": []},
        "identical": True,
        "sizes": [500] * 3,
    }
    report = analyze(raw, [FAULT], LINES, final(), logs, settings())
    assert report["ok"], report["checks"]
    assert report["timeline"][0]["first_write_s"] == 0.2
    assert report["timeline"][0]["catch_up_s"] == 0.5
    assert "**Verdict: PASS.**" in markdown(report)

    raw.append(get("b", "k", "1", 7.0, 7.1))  # stale: "2" was acknowledged at 5.2
    logs["missing"]["2"] = ["k=2"]
    broken = analyze(raw, [FAULT], LINES, final(), logs, settings())
    assert not broken["ok"]
    assert not broken["checks"]["linearizable"]["ok"]
    assert not broken["checks"]["acknowledged_on_every_member"]["ok"]
    assert broken["checks"]["recovery"]["ok"]
    text = markdown(broken)
    assert "**Verdict: FAIL.**" in text
    assert "### Key 'k': not linearizable" in text
    assert "get('k') -> '1'" in text


def test_members_that_disagree_fail_the_convergence_check() -> None:
    raw = [put("a", "k", "1", 0.0, 1.0)]
    logs = {"missing": {}, "identical": True, "sizes": [500] * 3}
    split = final()
    split["digests"]["2"] = "500 3 def"
    report = analyze(raw, [], [], split, logs, settings())
    assert not report["checks"]["converged"]["ok"]
    assert report["checks"]["linearizable"]["ok"]
