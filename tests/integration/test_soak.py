"""A minute of ``scripts/soak.py`` (issue 36): a 3-member cluster under steady
key-value load over a small key set (so the service's state stops growing within
seconds), with session churn and two faults (a follower paused for 8 s, a snapshot; the
members keep their processes, so each has half a minute of samples after its warm-up).
It fails if any acknowledged write does not read back, or if a member's resident memory
grows faster than :data:`MAX_RSS_SLOPE` after its warm-up: before the fix of issue 36 it
grew with every byte of log (several hundred MB an hour at this rate).  ``pytest -s``
prints the summary; the table and plot are left in the test's directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_RSS_SLOPE = 300.0
"""MB/h, after each process's first 25 s.  Measured with this very run: 750-840 before
the fix of issue 36, -2 to 110 after (a megabyte over the half minute is 100 MB/h)."""


def test_a_minute_of_soak_loses_nothing_and_memory_stays_flat(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "soak.py"),
            "--minutes", "1",
            "--keys", "2000",
            "--rate", "300",
            "--writers", "2",
            "--churn", "1",
            "--fault-every", "20",
            "--faults", "pause-follower,snapshot",
            "--sample-every", "2",
            "--warmup", "25",
            "--max-rss-slope", str(MAX_RSS_SLOPE),
            "--dir", str(tmp_path / "data"),
            "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    summary = json.loads((out / "soak.json").read_text())
    print("\n[soak]", json.dumps({k: v for k, v in summary.items() if k != "faults"}))
    assert summary["lost_count"] == 0, summary["lost_explained"]
    assert summary["puts_acknowledged"] > 5000
    slopes = summary["rss_slope_mb_per_hour"]
    assert slopes, "no member lived past its warm-up"
    assert max(slopes.values()) <= MAX_RSS_SLOPE, slopes
    assert (out / "soak.csv").stat().st_size > 0
    assert done.returncode == 0, done.stderr[-2000:]
