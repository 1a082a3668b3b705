"""``cluster-tool``'s commands on a data directory, with no cluster: a stopped member's,
a live one's or a copy.  They read the directory and never change it.

- ``pid --dir D``: the process holding it (Aeron's ClusterTool ``pid``);
- ``verify --dir D``: every record of every segment (CRC, length, contiguity), the
  recording log and every snapshot it names; exit 1 on damage, naming file and offset.
  A backup is also held to what its ``backup.json`` promises (:mod:`cluster.backup.check`:
  no torn tail, the log and snapshot it names, whole); links and special files are
  refused, never followed;
- ``recovery-plan --dir D``: which snapshot a start would load and which log it would
  replay after it (Aeron's ``recovery-plan``);
- ``describe-snapshot --dir D``: the latest valid snapshot's position, term, time,
  sessions, timers and service bytes (Aeron's ``describe-latest-cm-snapshot``).
"""

from __future__ import annotations

import bisect
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..archive.errors import ArchiveCorruptionError, ArchiveError
from ..archive.identity import DataDirError, holder_pid, read_identity
from ..archive.reader import (
    BadRecord,
    SegmentInfo,
    check_torn_tail,
    list_segments,
    open_regular_segment,
    scan_records,
)
from ..archive.record import RECORD_HEADER_LENGTH
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.snapshots import read_snapshot, snapshot_path
from ..archive.synced import read_floor
from ..backup.check import backup_problems, marks, problem
from ..backup.manifest import MANIFEST, ManifestError, Promise, read_manifest
from ..core.snapshot import LoadedSnapshot, SnapshotError, parse_snapshot
from ..protocol.codec import LOG
from ..protocol.errors import ProtocolError
from . import render
from .commands import emit

OFFLINE = ("pid", "verify", "recovery-plan", "describe-snapshot")


class _Unusable(Exception):
    """The directory cannot be read as a member's (exit 2)."""


def _check_dir(directory: Path) -> None:
    if not directory.is_dir():
        raise _Unusable(f"{directory} is not a directory")
    if not (directory / "recording.log").exists() and not (directory / "archive").is_dir():
        raise _Unusable(f"{directory} is no member's data directory (no recording.log, no archive)")


# ---------------------------------------------------------------------- pid


def cmd_pid(directory: Path, output: str) -> int:
    """The process holding ``directory``; exit 1 when none does."""
    try:
        pid = holder_pid(directory)
        identity = read_identity(directory)
    except DataDirError as exc:
        raise _Unusable(str(exc)) from None
    if output == "json":
        emit({
            "dir": str(directory),
            "pid": pid,
            "held": pid is not None,
            "member_id": None if identity is None else identity.member_id,
            "cluster_id": None if identity is None else identity.cluster_id,
        })  # fmt: skip
    elif pid is None:
        print(f"no process holds {directory}")
    else:
        print(pid if pid else f"held by a process that wrote no pid in {directory}")
    return 0 if pid is not None else 1


# ---------------------------------------------------------------------- verify


@dataclass
class LogScan:
    """What reading every record of a log's segments found."""

    records: int = 0
    whole_end: int | None = None
    """Where the whole, valid records from the first segment's base end (at the first
    bad one; None: no segment)."""
    problems: list[dict[str, Any]] = field(default_factory=list)
    inside: dict[int, int] = field(default_factory=dict)
    """Each position asked about that falls inside a record: that record's position."""
    first: bytes | None = None
    """The body of the first record at or after ``since`` (its time), and the last's."""
    last: bytes | None = None


def scan_log(
    segments: list[SegmentInfo],
    *,
    whole_until: int | None = None,
    marks: Iterable[int] = (),
    since: int = 0,
    synced: int = 0,
) -> LogScan:
    """Every record of ``segments``, each segment read to the size it was listed with.

    A bad record in the last segment that no valid record follows is a torn tail: a
    note (a start truncates it) for a member's directory; damage below ``whole_until``
    (a backup's ``log_end``: it was written whole) or ``synced`` (the member's
    ``synced-position``, :mod:`cluster.archive.synced`)."""
    scan = LogScan(whole_end=segments[0].base if segments else None)
    points = sorted(marks)
    whole = True
    last: memoryview | None = None
    for index, segment in enumerate(segments):
        try:
            fd, _size = open_regular_segment(segment)
        except ArchiveError as exc:
            scan.problems.append(_damage(exc))
            whole = False
            continue
        except OSError as exc:
            scan.problems.append(problem(segment.path, segment.base, f"cannot read: {exc}"))
            whole = False
            continue
        try:
            records = scan_records(fd, 0, segment.length, segment.base)
            bad: BadRecord | None
            while True:
                try:
                    position, body = next(records)
                except StopIteration as stop:
                    bad = stop.value
                    break
                scan.records += 1
                end = position + RECORD_HEADER_LENGTH + len(body)
                at = bisect.bisect_right(points, position)
                if at < len(points) and points[at] < end:
                    for point in points[at : bisect.bisect_left(points, end)]:
                        scan.inside[point] = position
                if position >= since:
                    if scan.first is None:
                        scan.first = bytes(body)
                    last = body  # a view of an immutable chunk: kept cheaply
            if bad is None:
                if whole:
                    scan.whole_end = segment.end
                continue
            position = segment.base + bad.offset
            if whole:
                scan.whole_end, whole = position, False
            try:
                check_torn_tail(fd, segment, bad, last=index == len(segments) - 1, synced=synced)
            except ArchiveError as exc:
                scan.problems.append(_damage(exc))
                continue
            if whole_until is not None and position < whole_until:
                scan.problems.append(problem(
                    segment.path, position,
                    f"{bad.reason} at file offset {bad.offset}, inside the log "
                    f"{MANIFEST} names (to {whole_until}): a backup is written whole, "
                    "so it is damaged, not torn",
                ))  # fmt: skip
            elif whole_until is not None:
                scan.problems.append(problem(
                    segment.path, position,
                    f"{bad.reason} at file offset {bad.offset}, past the log {MANIFEST} "
                    f"names (to {whole_until}): a restore does not copy it", note=True,
                    torn_tail=True,
                ))  # fmt: skip
            else:
                scan.problems.append(problem(
                    segment.path, position,
                    f"torn tail ({bad.reason}): a start truncates it there", note=True,
                    torn_tail=True,
                ))  # fmt: skip
        finally:
            os.close(fd)
    scan.last = None if last is None else bytes(last)
    return scan


def _damage(exc: ArchiveError) -> dict[str, Any]:
    if isinstance(exc, ArchiveCorruptionError):  # its file apart, as every problem's
        return problem(exc.path, exc.position,
                       f"corruption at position {exc.position}: {exc.reason}")  # fmt: skip
    return problem("", None, str(exc))


def _time(body: bytes | None) -> str | None:
    """A log record's cluster time, ISO-8601 (None: no record, or not a log message)."""
    if body is None:
        return None
    try:
        return render.iso_ms(LOG.decode(body).timestamp)
    except ProtocolError:
        return None


def verify(directory: Path) -> dict[str, Any]:
    """Everything ``verify`` checks, as its JSON document.  A backup (a directory with
    ``backup.json``) is also held to what its manifest promises
    (:mod:`cluster.backup.check`), and has no torn tail."""
    _check_dir(directory)
    problems: list[dict[str, Any]] = []
    manifest: dict[str, Any] | None = None
    promise: Promise | None = None
    if os.path.lexists(directory / MANIFEST):
        try:
            manifest, _raw = read_manifest(directory)
            promise = Promise.of(manifest)
        except ManifestError as exc:
            problems.append(problem(directory / MANIFEST, None, str(exc)))
    entries = 0
    recording: RecordingLog | None = None
    try:
        recording = RecordingLog.read(directory)
        entries = len(recording.entries)
    except ArchiveError as exc:
        problems.append(_damage(exc))
    if recording is not None and recording.torn_at is not None and promise is None:
        problems.append(problem(recording.path, recording.torn_at,
                                f"a torn last entry at byte {recording.torn_at}: a start "
                                "truncates it", note=True))  # fmt: skip
    segments: list[SegmentInfo] | None = []
    archive = directory / "archive"
    synced = 0
    if archive.is_dir():
        try:
            synced = read_floor(archive)
            segments = list_segments(archive)
        except ArchiveError as exc:
            problems.append(_damage(exc))
            segments = None
    to_check = marks(promise, recording) if promise is not None else {}
    since = promise.log_start if promise is not None and promise.log_start is not None else 0
    scan = scan_log(segments or [], marks=to_check, since=since, synced=synced,
                    whole_until=None if promise is None else (promise.log_end or 0))  # fmt: skip
    problems += scan.problems
    snapshots: list[dict[str, Any]] = []
    for entry in recording.snapshots(CM_SERVICE_ID) if recording is not None else []:
        path = snapshot_path(directory, entry.log_position, entry.leadership_term_id)
        try:
            records = read_snapshot(path)
            parse_snapshot(records)  # its layout too: an empty file reads as no records
        except ArchiveError as exc:
            problems.append(_damage(exc))
            continue
        except SnapshotError as exc:
            problems.append(problem(path, entry.log_position, f"not a snapshot: {exc}"))
            continue
        snapshots.append({
            "file": str(path),
            "log_position": entry.log_position,
            "leadership_term_id": entry.leadership_term_id,
            "time": render.iso_ms(entry.timestamp),
            "records": len(records),
        })  # fmt: skip
    if promise is not None:
        problems += backup_problems(
            directory, promise, segments=segments, whole_end=scan.whole_end,
            inside=scan.inside, recording=recording,
            whole_snapshots={s["log_position"] for s in snapshots},
        )  # fmt: skip
    listed = segments or []
    return {
        "dir": str(directory),
        "ok": all(p["note"] for p in problems),
        "recording_log_entries": entries,
        "segments": len(listed),
        "log_start": listed[0].base if listed else None,
        "log_end": listed[-1].end if listed else None,
        "records": scan.records,
        "records_end": scan.whole_end,
        "first_record_time": _time(scan.first),
        "last_record_time": _time(scan.last),
        "snapshots": snapshots,
        "backup": None if manifest is None else _backup_facts(manifest, promise),
        "problems": problems,
    }


def _backup_facts(manifest: dict[str, Any], promise: Promise | None) -> dict[str, Any]:
    """What ``verify`` says of a backup's manifest."""
    created, updated = manifest.get("created"), manifest.get("updated")
    return {
        "kind": manifest.get("kind", "offline" if "snapshots" not in manifest else None),
        "source": manifest.get("source"),
        "cluster_id": manifest.get("cluster_id"),
        "new_cluster_id": manifest.get("new_cluster_id"),
        "created": render.iso(created) if isinstance(created, int | float) else None,
        "updated": render.iso(updated) if isinstance(updated, int | float) else None,
        "log_start": None if promise is None else promise.log_start,
        "log_end": None if promise is None else promise.log_end,
        "covers": None if promise is None else promise.covers,
        "snapshot": None if promise is None else promise.snapshot,
    }


def cmd_verify(directory: Path, output: str) -> int:
    document = verify(directory)
    if output == "json":
        emit(document)
        return 0 if document["ok"] else 1
    span = "no log"
    if document["segments"]:
        span = f"log [{document['log_start']}, {document['log_end']})"
        if document["first_record_time"]:
            span += f" ({document['first_record_time']} to {document['last_record_time']})"
    print(
        f"{directory}: {document['records']} records in {document['segments']} segments, "
        f"{span}; recording log {document['recording_log_entries']} entries; "
        f"{len(document['snapshots'])} snapshots checked"
    )
    backup = document["backup"]
    if backup is not None:
        print(
            f"  backup ({backup['kind'] or 'unknown kind'}): covers {backup['covers']}, "
            f"log [{backup['log_start']}, {backup['log_end']}), snapshot at "
            f"{backup['snapshot'] if backup['snapshot'] is not None else 'none'}"
        )
    for snap in document["snapshots"]:
        print(f"  snapshot at {snap['log_position']} (term {snap['leadership_term_id']}, "
              f"{snap['time']})")  # fmt: skip
    for found in document["problems"]:
        kind = "note" if found["note"] else "DAMAGED"
        print(f"  {kind}: {found['file']}: {found['problem']}")
    print("ok" if document["ok"] else "damaged")
    return 0 if document["ok"] else 1


# ---------------------------------------------------------------------- the start


def _latest_snapshot(
    directory: Path, recording: RecordingLog, log_end: int
) -> tuple[LoadedSnapshot | None, Path | None, list[str]]:
    """The snapshot a start would load (the newest valid one that loads and is not past
    the log's end), its file, and why newer ones were passed over."""
    skipped: list[str] = []
    for entry in reversed(recording.snapshots(CM_SERVICE_ID)):
        path = snapshot_path(directory, entry.log_position, entry.leadership_term_id)
        if entry.log_position > log_end:
            skipped.append(f"{path.name}: beyond the end of the log ({log_end})")
            continue
        try:
            return parse_snapshot(read_snapshot(path)), path, skipped
        except (ArchiveError, SnapshotError) as exc:
            skipped.append(f"{path.name}: {exc}")
    return None, None, skipped


def recovery_plan(directory: Path) -> dict[str, Any]:
    _check_dir(directory)
    try:
        recording = RecordingLog.read(directory)
        segments = list_segments(directory / "archive") if (directory / "archive").is_dir() else []
    except ArchiveError as exc:
        raise _Unusable(f"cannot plan: {exc}") from None
    log_start = max(recording.log_start, segments[0].base if segments else 0)
    log_end = segments[-1].end if segments else log_start
    snapshot, path, skipped = _latest_snapshot(directory, recording, log_end)
    replay_from = snapshot.log_position if snapshot is not None else log_start
    terms = [
        {
            "leadership_term_id": e.leadership_term_id,
            "term_base_log_position": e.term_base_log_position,
            "log_position": e.log_position,
        }
        for e in recording.entries
        if e.type == 0 and e.is_valid and (e.log_position < 0 or e.log_position > replay_from)
    ]
    return {
        "dir": str(directory),
        "snapshot": None
        if snapshot is None
        else {
            "file": str(path),
            "log_position": snapshot.log_position,
            "leadership_term_id": snapshot.leadership_term_id,
        },
        "skipped_snapshots": skipped,
        "log_start": log_start,
        "log_end": log_end,
        "replay": {"from": replay_from, "to": log_end, "bytes": max(0, log_end - replay_from)},
        "terms": terms,
    }


def cmd_recovery_plan(directory: Path, output: str) -> int:
    plan = recovery_plan(directory)
    if output == "json":
        emit(plan)
        return 0
    snap = plan["snapshot"]
    print(
        "snapshot: none (the whole log is replayed)"
        if snap is None
        else f"snapshot: {snap['file']} (log position {snap['log_position']}, "
        f"term {snap['leadership_term_id']})"
    )
    for why in plan["skipped_snapshots"]:
        print(f"  passed over: {why}")
    replay = plan["replay"]
    print(f"replay: log [{replay['from']}, {replay['to']}), {replay['bytes']} bytes")
    for term in plan["terms"]:
        end = term["log_position"] if term["log_position"] >= 0 else "open"
        print(
            f"  term {term['leadership_term_id']}: from {term['term_base_log_position']} to {end}"
        )
    return 0


def describe_snapshot(directory: Path) -> dict[str, Any] | None:
    _check_dir(directory)
    try:
        recording = RecordingLog.read(directory)
    except ArchiveError as exc:
        raise _Unusable(f"cannot read the recording log: {exc}") from None
    snapshot, path, _skipped = _latest_snapshot(directory, recording, 1 << 62)
    if snapshot is None:
        return None
    entry = next(
        e for e in reversed(recording.snapshots(CM_SERVICE_ID))
        if e.log_position == snapshot.log_position
    )  # fmt: skip
    return {
        "file": str(path),
        "log_position": snapshot.log_position,
        "leadership_term_id": snapshot.leadership_term_id,
        "timestamp": render.iso_ms(entry.timestamp),
        "next_session_id": snapshot.module.next_session_id,
        "sessions": [
            {"cluster_session_id": s.cluster_session_id, "response_channel": s.response_channel}
            for s in snapshot.client_sessions
        ],
        "timers": [
            {"correlation_id": t.correlation_id, "deadline": t.deadline} for t in snapshot.timers
        ],
        "pending_service_messages": len(snapshot.pending),
        "service_state_bytes": len(snapshot.service_state),
    }


def cmd_describe_snapshot(directory: Path, output: str) -> int:
    document = describe_snapshot(directory)
    if output == "json":
        emit(document)
    elif document is None:
        print(f"no valid snapshot in {directory}")
    else:
        print(
            f"{document['file']}\n  log position {document['log_position']}, term "
            f"{document['leadership_term_id']}, taken {document['timestamp']}\n"
            f"  {len(document['sessions'])} sessions, {len(document['timers'])} timers, "
            f"{document['pending_service_messages']} pending service messages, "
            f"service state {document['service_state_bytes']} bytes"
        )
    return 0 if document is not None else 1


def run(command: str, args: Any) -> int:
    commands = {
        "pid": cmd_pid,
        "verify": cmd_verify,
        "recovery-plan": cmd_recovery_plan,
        "describe-snapshot": cmd_describe_snapshot,
    }
    try:
        return commands[command](Path(args.dir), args.output)
    except _Unusable as exc:
        print(f"cluster-tool {command}: error: {exc}", file=sys.stderr)
        return 2
