"""``cluster-tool restore``: one member's data directory made from a backup (issue 34).

The backup is checked first, whole, against what its ``backup.json`` promises
(:func:`cluster.tool.offline.verify`, :mod:`cluster.backup.check`): a backup that
cannot deliver it is refused before anything is written, naming the file and position.
Then the member's directory is made: the log up to the target (the end of the backup's
log, or a point in time: ``--to-position``, a record's end, or ``--to-time``, the end of
the last record at or before that time), copied from regular files only and no more
than the sizes checked, then scanned again; the recording log (terms and snapshots
after the target removed), the snapshots up to it, ``node-state.json`` (the commit
position the backup covers, never past the target) and ``member.json`` (the member id
given, voting).  A restore claims only the position its log reaches; on any failure
the directory it began is removed.

Each member of the new cluster is restored from the same backup with its own
``--member-id``: they get the same cluster id (``backup.json``'s ``new_cluster_id``,
drawn when the backup was made), or with ``--same-cluster`` the source's, to replace
lost members of the existing cluster; that is refused unless the backup covers (and
the restore reaches) the commit position the operator says the cluster reached
(``--cluster-commit``).  A restored member starts with the same command line as any
other, with no ``--cluster-id``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..archive.errors import ArchiveError
from ..archive.identity import Identity, write_identity
from ..archive.node_state import NodeState
from ..archive.reader import list_segments, open_regular_segment, scan_records
from ..archive.record import RECORD_HEADER_LENGTH
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.snapshots import read_snapshot, snapshot_path
from ..backup.manifest import ManifestError, Promise, read_manifest
from ..fileio import copy_regular, fsync_directory, read_regular, write_all
from ..protocol.codec import LOG
from ..protocol.errors import ProtocolError
from . import render
from .commands import emit
from .offline import scan_log, verify

RESTORE_ATTEMPTS = 5
"""A restore from a directory that a running ``cluster-backup`` changed under it is
tried again (it changes every poll, atomically)."""
MAX_RECORDING_LOG = 64 << 20
"""The most a recording log is read for (64 bytes an entry: a million entries)."""


class RestoreError(Exception):
    """The restore cannot be made as asked (exit 1, the reason in words)."""


class BackupChanged(RestoreError):
    """The backup changed under the restore (a running ``cluster-backup``): try again."""


def _changing(backup: Path, manifest_bytes: bytes) -> bool:
    """Whether a ``cluster-backup`` changed the backup since its manifest was read (or
    is half-way through replacing its log)."""
    if (backup / "archive.new").exists() or (backup / "archive.old").exists():
        return True
    try:
        return read_manifest(backup)[1] != manifest_bytes
    except ManifestError:
        return True


def _refusal(backup: Path, checked: dict[str, Any]) -> str:
    lines = [f"  {p['file']}: {p['problem']}" for p in checked["problems"] if not p["note"]]
    return f"{backup} cannot deliver what its backup.json promises; nothing restored:\n" + (
        "\n".join(lines)
    )


def _floor(backup: Path, promise: Promise, recording: RecordingLog) -> int:
    """The oldest position a restore from the backup can reach: the start of a log
    that begins at 0, else its oldest snapshot within its log."""
    start, end = promise.log_start, promise.log_end
    assert start is not None
    assert end is not None
    if start == 0:
        return 0
    held = [
        e.log_position for e in recording.snapshots(CM_SERVICE_ID) if start <= e.log_position <= end
    ]
    if not held:
        raise RestoreError(
            f"{backup}: its log begins at {start} and it holds no snapshot "
            "there or after: it cannot be restored"
        )
    return min(held)


def _records(backup: Path, start: int, stop: int) -> Iterator[tuple[int, memoryview]]:
    """The backup's records from ``start`` (a record's start) that end by ``stop``."""
    for segment in list_segments(backup / "archive"):
        if segment.end <= start or segment.base >= stop:
            continue
        fd, _size = open_regular_segment(segment)
        try:
            records = scan_records(fd, 0, min(segment.length, stop - segment.base), segment.base)
            for position, body in records:
                if position >= start:
                    yield position, body
        finally:
            os.close(fd)


def _last_record_end(backup: Path, floor: int, position: int) -> int:
    """The end of the last record from ``floor`` on that ends at or before ``position``
    (``floor`` when none does)."""
    last = floor
    for at, body in _records(backup, floor, position):
        last = at + RECORD_HEADER_LENGTH + len(body)
    return last


def _at_time(
    backup: Path, recording: RecordingLog, floor: int, end: int, millis: int
) -> tuple[int, int | None]:
    """The end of the last record at or before ``millis`` (cluster time, epoch ms) from
    ``floor`` on, and its time; the log's order is its time's (a leader never stamps an
    entry earlier than one before it)."""
    best: int | None = None
    when: int | None = None
    for entry in recording.snapshots(CM_SERVICE_ID):
        if entry.log_position == floor and entry.timestamp <= millis:
            best, when = floor, entry.timestamp
    for position, body in _records(backup, floor, end):
        try:
            stamp = LOG.decode(body).timestamp
        except ProtocolError as exc:
            raise RestoreError(
                f"the record at log position {position} is no log entry this version reads: {exc}"
            ) from None
        if stamp > millis:
            break
        best, when = position + RECORD_HEADER_LENGTH + len(body), stamp
    if best is None:
        raise RestoreError(
            f"nothing the backup holds is at or before {render.iso_ms(millis)}: "
            f"a restore reaches back to log position {floor} at the earliest "
            "(cluster-tool verify --dir BACKUP lists its snapshots and log "
            "times)"
        )
    return best, when


def _copy_file(source: Path, into: Path, length: int | None = None) -> None:
    """The first ``length`` bytes (default: all) of the regular file ``source`` into a
    new ``into``; :class:`BackupChanged` when it holds fewer."""
    copied = copy_regular(source, into, length)
    if length is not None and copied != length:
        raise BackupChanged(f"{source} holds {copied} bytes, not {length}")


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_log(backup: Path, node_dir: Path, start: int, target: int) -> None:
    """The backup's log segments from the one holding ``start`` up to ``target``, cut
    there; then the copy scanned: whole, valid records ending at ``target``."""
    (node_dir / "archive").mkdir()
    segments = list_segments(backup / "archive")
    for segment in segments:
        if segment.base > target or (segment.end <= start and segment.base < start):
            continue
        _copy_file(
            segment.path,
            node_dir / "archive" / segment.path.name,
            min(segment.length, target - segment.base),
        )
    copied = list_segments(node_dir / "archive")
    scan = scan_log(copied, whole_until=target)
    damaged = [p for p in scan.problems if not p["note"]]
    end = copied[-1].end if copied else start  # no segment: an empty log, begun at start
    if copied and copied[0].base > start:  # dropped by retention since it was checked
        raise BackupChanged(f"the log copied from {backup} begins at {copied[0].base}, "
                            f"after {start}")  # fmt: skip
    if damaged or end != target or (copied and scan.whole_end != target):
        raise BackupChanged(
            f"the log copied from {backup} does not end in whole records at {target} "
            f"(it ends at {end}: {'; '.join(p['problem'] for p in damaged) or 'short'})"
        )


def _copy_snapshots(backup: Path, node_dir: Path, recording: RecordingLog, target: int) -> None:
    """The snapshot files the recording log names up to ``target``, each read back
    whole."""
    (node_dir / "snapshots").mkdir()
    for entry in recording.snapshots(CM_SERVICE_ID):
        if entry.log_position > target:
            continue
        source = snapshot_path(backup, entry.log_position, entry.leadership_term_id)
        into = snapshot_path(node_dir, entry.log_position, entry.leadership_term_id)
        _copy_file(source, into)
        read_snapshot(into)  # whole, as it was checked


def restore(
    backup: Path,
    node_dir: Path,
    member_id: int,
    *,
    same_cluster: bool = False,
    cluster_commit: int | None = None,
    to_position: int | None = None,
    to_time: int | None = None,
) -> dict[str, Any]:
    """Make member ``member_id``'s data directory ``node_dir`` from ``backup``
    (``to_time``: cluster time, epoch milliseconds)."""
    try:
        manifest, manifest_bytes = read_manifest(backup)
        promise = Promise.of(manifest)
    except ManifestError as exc:
        raise RestoreError(str(exc)) from None
    if node_dir.exists() and any(node_dir.iterdir()):
        raise RestoreError(
            f"{node_dir} is not empty: a member's directory is restored into a new one"
        )
    if same_cluster:
        if cluster_commit is None:
            raise RestoreError(
                "--same-cluster needs --cluster-commit P (the cluster's commit position)"
            )
        if promise.covers < cluster_commit:
            raise RestoreError(
                f"the backup covers log position {promise.covers}, short of the cluster's "
                f"commit {cluster_commit}: restoring it into the same cluster would lose writes"
            )
        if manifest.get("cluster_id") is None:
            raise RestoreError("the backup does not say which cluster it came from")
    if promise.log_start is None or promise.log_end is None:
        raise RestoreError(
            f"{backup} holds no log yet (a cluster-backup that has pulled "
            "nothing): nothing to restore"
        )
    try:  # read once: what is checked, planned from and written
        recording_bytes = read_regular(backup / "recording.log", MAX_RECORDING_LOG)
    except OSError as exc:
        raise RestoreError(f"{backup} has no readable recording.log: {exc}") from None
    checked = verify(backup)
    if not checked["ok"]:
        if _changing(backup, manifest_bytes):
            raise BackupChanged(f"{backup} changed while it was checked")
        raise RestoreError(_refusal(backup, checked))
    recording = RecordingLog.of_bytes(backup / "recording.log", recording_bytes)
    floor = _floor(backup, promise, recording)
    end = promise.log_end
    target, when = end, None
    if to_position is not None:
        if not floor <= to_position <= end:
            raise RestoreError(
                f"--to-position {to_position} is outside what the backup holds: [{floor}, "
                f"{end}] (from its oldest snapshot to the end of its log)"
            )
        before = _last_record_end(backup, floor, to_position)
        if before != to_position:
            raise RestoreError(
                f"--to-position {to_position} is not where a record ends (the last one "
                f"before it ends at {before})"
            )
        target = to_position
    elif to_time is not None:
        target, when = _at_time(backup, recording, floor, end, to_time)
    if same_cluster and cluster_commit is not None and target < cluster_commit:
        raise RestoreError(
            f"a point in time ({target}) before the cluster's commit {cluster_commit} "
            "cannot join the same cluster: restore a new cluster from it"
        )
    node_dir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            _copy_log(backup, node_dir, promise.log_start, target)
            _copy_snapshots(backup, node_dir, recording, target)
            _write_new(node_dir / "recording.log", recording_bytes)
        except (OSError, ArchiveError, BackupChanged) as exc:
            # a running cluster-backup drops files only once its manifest no longer
            # names them, and appends past the log_end read: a file gone or short is a
            # newer state (checked again from the start), else damage since the check
            if _changing(backup, manifest_bytes) or isinstance(exc, BackupChanged):
                raise BackupChanged(f"{backup} changed while it was copied: {exc}") from None
            raise RestoreError(f"copying {backup} failed, nothing restored: {exc}") from None
        with RecordingLog.open(node_dir) as log:
            while (newest := log.get_latest_snapshot(CM_SERVICE_ID)) is not None and (
                newest.log_position > target
            ):  # a point in time before it: the snapshot before that one
                log.invalidate_latest_snapshot()
            log.remove_terms_from(target + 1)
            last = log.find_last_term()
            used = log.get_latest_snapshot(CM_SERVICE_ID)
        snapshot = used and {
            "log_position": used.log_position,
            "leadership_term_id": used.leadership_term_id,
        }
        commit = min(promise.covers, target)
        NodeState(node_dir).save(
            candidate_term_id=-1 if last is None else last.leadership_term_id,
            commit_position=commit,
        )
        cluster_id = manifest["cluster_id"] if same_cluster else manifest["new_cluster_id"]
        write_identity(node_dir, Identity(cluster_id, member_id, voting=True))
        # every file was fsynced as it was written; their names last once their
        # folders are: a power cut after the restore said done loses none of them
        for folder in (node_dir / "archive", node_dir / "snapshots", node_dir, node_dir.parent):
            if folder.is_dir():
                fsync_directory(folder)
    except BaseException:
        shutil.rmtree(node_dir, ignore_errors=True)
        raise
    return {
        "dir": str(node_dir),
        "member_id": member_id,
        "cluster_id": cluster_id,
        "log_end": target,
        "log_end_time": render.iso_ms(when),
        "commit_position": commit,
        "snapshot": snapshot,
    }


def cmd_restore(args: Any) -> int:
    for attempt in range(RESTORE_ATTEMPTS):
        try:
            done = restore(
                Path(getattr(args, "from")),
                Path(args.dir),
                args.member_id,
                same_cluster=args.same_cluster,
                cluster_commit=args.cluster_commit,
                to_position=args.to_position,
                to_time=args.to_time,
            )
            break
        except BackupChanged as exc:  # a running cluster-backup: its next state
            if attempt + 1 < RESTORE_ATTEMPTS:
                time.sleep(0.5)
                continue
            print(f"cluster-tool restore: error: {exc}", file=sys.stderr)
            return 1
        except RestoreError as exc:
            print(f"cluster-tool restore: error: {exc}", file=sys.stderr)
            return 1
    if args.output == "json":
        emit(done)
    else:
        at = (
            f" (the last record at or before the time: {done['log_end_time']})"
            if (done["log_end_time"])
            else ""
        )
        print(
            f"member {done['member_id']} of cluster {done['cluster_id']} restored in "
            f"{done['dir']}: log to position {done['log_end']}{at}, commit "
            f"{done['commit_position']}"
        )
    return 0
