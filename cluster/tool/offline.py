"""``cluster-tool``'s commands on a data directory, with no cluster: a stopped member's,
a live one's or a copy.  They read the directory and never change it.

- ``pid --dir D``: the process holding it (Aeron's ClusterTool ``pid``);
- ``verify --dir D``: every record of every segment (CRC, length, contiguity), the
  recording log and every snapshot it names; exit 1 on damage, naming file and offset;
- ``recovery-plan --dir D``: which snapshot a start would load and which log it would
  replay after it (Aeron's ``recovery-plan``);
- ``describe-snapshot --dir D``: the latest valid snapshot's position, term, time,
  sessions, timers and service bytes (Aeron's ``describe-latest-cm-snapshot``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..archive.errors import ArchiveError
from ..archive.identity import DataDirError, holder_pid, read_identity
from ..archive.reader import BadRecord, SegmentInfo, check_torn_tail, list_segments, scan_records
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.snapshots import read_snapshot, snapshot_path
from ..core.snapshot import LoadedSnapshot, SnapshotError, parse_snapshot
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


def _verify_segments(segments: list[SegmentInfo]) -> tuple[int, list[dict[str, Any]]]:
    """How many records, and what is wrong (a torn tail of the last segment is a note:
    a start truncates it)."""
    records = 0
    found: list[dict[str, Any]] = []
    for index, segment in enumerate(segments):
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            scan = scan_records(fd, 0, segment.length, segment.base)
            bad: BadRecord | None
            while True:
                try:
                    next(scan)
                    records += 1
                except StopIteration as stop:
                    bad = stop.value
                    break
            if bad is None:
                continue
            try:
                check_torn_tail(fd, segment, bad, last=index == len(segments) - 1)
            except ArchiveError as exc:
                found.append(_damage(exc))
            else:
                found.append({
                    "file": str(segment.path),
                    "offset": bad.offset,
                    "position": segment.base + bad.offset,
                    "torn_tail": True,
                    "problem": f"torn tail ({bad.reason}): a start truncates it there",
                })  # fmt: skip
        finally:
            os.close(fd)
    return records, found


def _damage(exc: ArchiveError) -> dict[str, Any]:
    return {
        "file": str(getattr(exc, "path", "")),
        "offset": getattr(exc, "position", None),
        "position": getattr(exc, "position", None),
        "torn_tail": False,
        "problem": str(exc),
    }


def verify(directory: Path) -> dict[str, Any]:
    """Everything ``verify`` checks, as its JSON document."""
    _check_dir(directory)
    problems: list[dict[str, Any]] = []
    entries = 0
    snapshots: list[dict[str, Any]] = []
    try:
        recording = RecordingLog.read(directory)
        entries = len(recording.entries)
    except ArchiveError as exc:
        problems.append(_damage(exc))
        recording = None
    segments: list[SegmentInfo] = []
    records = 0
    archive = directory / "archive"
    if archive.is_dir():
        try:
            segments = list_segments(archive)
        except ArchiveError as exc:
            problems.append(_damage(exc))
        else:
            records, found = _verify_segments(segments)
            problems += found
    for entry in recording.snapshots(CM_SERVICE_ID) if recording is not None else []:
        path = snapshot_path(directory, entry.log_position, entry.leadership_term_id)
        try:
            count = len(read_snapshot(path))
        except ArchiveError as exc:
            problems.append(_damage(exc))
            continue
        snapshots.append({"file": str(path), "log_position": entry.log_position, "records": count})
    return {
        "dir": str(directory),
        "ok": not any(not p["torn_tail"] for p in problems),
        "recording_log_entries": entries,
        "segments": len(segments),
        "log_start": segments[0].base if segments else None,
        "log_end": segments[-1].end if segments else None,
        "records": records,
        "snapshots": snapshots,
        "problems": problems,
    }


def cmd_verify(directory: Path, output: str) -> int:
    document = verify(directory)
    if output == "json":
        emit(document)
    else:
        span = (
            f"log [{document['log_start']}, {document['log_end']})"
            if document["segments"]
            else "no log"
        )
        print(
            f"{directory}: {document['records']} records in {document['segments']} segments, "
            f"{span}; recording log {document['recording_log_entries']} entries; "
            f"{len(document['snapshots'])} snapshots checked"
        )
        for problem in document["problems"]:
            kind = "note" if problem["torn_tail"] else "DAMAGED"
            print(f"  {kind}: {problem['file']}: {problem['problem']}")
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
