"""A member whose log holds other bytes than it wrote (bit rot, a misdirected write:
issue 44, item 4) refuses to start with one ERROR naming the segment file, the log
position and the file offset, and the runbook's remedy, and exit status 1: a real
``python -m cluster.node`` process on a data directory whose middle record was flipped
(it stops in its start-up scan, before it binds any port)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from cluster.archive.segments import Archive

ROOT = Path(__file__).resolve().parents[2]


def _record(body: bytes) -> bytes:
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def test_a_rotted_log_record_is_refused_with_the_remedy(tmp_path: Path) -> None:
    archive = Archive.open(tmp_path / "archive")
    archive.append(_record(b"x" * 50) + _record(b"y" * 50) + _record(b"z" * 50))
    archive.close()
    (segment,) = (tmp_path / "archive").glob("log-*.seg")
    data = bytearray(segment.read_bytes())
    data[58 + 20] ^= 0x04  # a bit of the second record's body
    segment.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "cluster.node", "--dir", str(tmp_path)]
    done = subprocess.run(
        [*command, "--members", "0=127.0.0.1:1:2:3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert "ERROR" in line
    assert segment.name in line
    assert "corruption at position 58" in line
    assert "file offset 58" in line
    assert "start it on an empty one" in line
    assert "Replacing a failed member" in line
