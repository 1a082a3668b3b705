"""What a backup promises, held against what its files hold (``cluster-tool verify`` on
a backup, and ``cluster-tool restore`` before it writes anything).

A backup was written whole (every record checked as it came, the manifest last), so
unlike a member's directory it has no torn tail: whatever it cannot deliver of what
``backup.json`` says it holds is damage, named by file and position.  It must hold the
log ``[log_start, log_end)`` in whole, valid records (a record's end at each of
``log_start``, ``covers``, ``log_end`` and its snapshots' positions), ``covers`` within
that log, the snapshot the manifest names in the recording log and whole, and a
recording log with no torn entry.  What lies past ``log_end`` is not the backup's yet
(a running ``cluster-backup`` appends it before its manifest names it): a restore
never copies it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..archive.reader import SegmentInfo
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from .manifest import MANIFEST, Promise


def problem(
    file: Path | str,
    position: int | None,
    text: str,
    *,
    note: bool = False,
    torn_tail: bool = False,
) -> dict[str, Any]:
    """One of ``verify``'s problems: damage, or a note (``note``: it does not fail)."""
    return {
        "file": str(file),
        "offset": position,
        "position": position,
        "torn_tail": torn_tail,
        "note": note,
        "problem": text,
    }


def marks(promise: Promise, recording: RecordingLog | None) -> dict[int, str]:
    """The positions where a record must end, each with what names it."""
    found: dict[int, str] = {}
    if promise.log_end is None or promise.log_start is None:
        return found
    for entry in recording.snapshots(CM_SERVICE_ID) if recording is not None else []:
        if promise.log_start <= entry.log_position <= promise.log_end:
            found[entry.log_position] = f"the snapshot at {entry.log_position}"
    found[promise.covers] = f"{MANIFEST}'s covers {promise.covers}"
    found[promise.log_start] = f"{MANIFEST}'s log_start {promise.log_start}"
    found[promise.log_end] = f"{MANIFEST}'s log_end {promise.log_end}"
    return found


def backup_problems(
    directory: Path,
    promise: Promise,
    *,
    segments: list[SegmentInfo] | None,
    whole_end: int | None,
    inside: dict[int, int],
    recording: RecordingLog | None,
    whole_snapshots: set[int],
) -> list[dict[str, Any]]:
    """What the backup in ``directory`` cannot deliver of ``promise``.

    ``segments``: its log's segments (None: they could not be listed, which is damage
    already named); ``whole_end``: where its whole, valid records from the first
    segment's base end; ``inside``: each of :func:`marks` that falls inside a record,
    with that record's position; ``whole_snapshots``: the positions of the snapshot
    files that read whole."""
    manifest = directory / MANIFEST
    start, end, covers = promise.log_start, promise.log_end, promise.covers
    found: list[dict[str, Any]] = []
    if recording is not None and recording.torn_at is not None:
        found.append(
            problem(
                recording.path,
                recording.torn_at,
                f"a torn entry at byte {recording.torn_at} of the recording log: "
                "a backup is written whole, so it is damaged",
            )
        )
    if start is None or end is None:
        if covers:
            found.append(problem(manifest, covers, f"covers {covers} but names no log"))
        else:
            found.append(
                problem(
                    manifest,
                    None,
                    "names no log yet (a cluster-backup that "
                    "has pulled nothing): nothing to restore",
                    note=True,
                )
            )
        return found
    if not start <= covers <= end:
        found.append(
            problem(
                manifest,
                covers,
                f"says it covers log position {covers}, outside the log it holds [{start}, {end})",
            )
        )
    if segments is not None:
        found += _log_problems(directory, promise, segments, whole_end)
    labels = marks(promise, recording)
    for mark, record in sorted(inside.items()):
        found.append(
            problem(
                _holder(directory, segments, record),
                mark,
                f"{labels.get(mark, mark)} falls inside the record at {record}, "
                "not at a record's end",
            )
        )
    if promise.snapshot is not None:
        found += _snapshot_problems(directory, promise, recording, whole_snapshots)
    elif start > 0:  # a log that does not begin at 0 is replayed from a snapshot
        found.append(
            problem(
                manifest,
                start,
                f"its log begins at {start} but it names no snapshot to replay it from",
            )
        )
    return found


def _holder(directory: Path, segments: list[SegmentInfo] | None, position: int) -> Path:
    """The segment file holding ``position`` (the archive folder when none does)."""
    for segment in reversed(segments or []):
        if segment.base <= position:
            return segment.path
    return directory / "archive"


def _log_problems(
    directory: Path, promise: Promise, segments: list[SegmentInfo], whole_end: int | None
) -> list[dict[str, Any]]:
    start, end, covers = promise.log_start, promise.log_end, promise.covers
    assert start is not None
    assert end is not None
    if not segments:
        if end == start:
            return []
        return [
            problem(
                directory / "archive",
                start,
                f"holds no log segment: {MANIFEST} names the log [{start}, {end}) "
                f"(it says it covers {covers})",
            )
        ]
    first = segments[0]
    if first.base > start:
        return [
            problem(
                first.path,
                start,
                f"the log begins at {first.base} ({first.path.name}), after the "
                f"log_start {start} that {MANIFEST} names: a segment is missing",
            )
        ]
    held = first.base if whole_end is None else whole_end
    if held < end:
        return [
            problem(
                _holder(directory, segments, held),
                held,
                f"the log holds whole records to position {held} only, short of "
                f"the log_end {end} that {MANIFEST} names (it says it covers "
                f"{covers})",
            )
        ]
    return []


def _snapshot_problems(
    directory: Path, promise: Promise, recording: RecordingLog | None, whole: set[int]
) -> list[dict[str, Any]]:
    position, term = promise.snapshot, promise.snapshot_term
    assert position is not None
    assert promise.log_start is not None
    assert promise.log_end is not None
    named = recording is not None and any(
        e.log_position == position and e.leadership_term_id == term
        for e in recording.snapshots(CM_SERVICE_ID)
    )
    where = directory / "recording.log"
    if not named:
        return [
            problem(
                where,
                position,
                f"{MANIFEST} names the snapshot at {position} "
                f"(term {term}) but the recording log does not",
            )
        ]
    if position not in whole:
        return [
            problem(
                directory / "snapshots",
                position,
                f"the snapshot at {position} that {MANIFEST} names is not held whole",
            )
        ]
    if not promise.log_start <= position <= promise.log_end:
        return [
            problem(
                where,
                position,
                f"the snapshot at {position} is outside the log the backup holds "
                f"[{promise.log_start}, {promise.log_end})",
            )
        ]
    return []
