"""``cluster-tool backup`` and ``cluster-tool restore``: a backup of a stopped member's
directory (``--from-dir``) or of the live cluster (over the admin port,
:mod:`cluster.backup.oneshot`), and a member's directory made from a backup (issue 34).

A **backup** is a directory holding what a start of a member needs: the member's
``recording.log`` (its terms and snapshots), its latest valid snapshot(s) and its log
segments (from the first one it holds: compaction keeps it bounded), and ``backup.json``:
where it came from, the snapshot it starts from, the log it holds and the position it
**covers**: the commit position the member had saved (``node-state.json``), never more
than its log.  Every record is checked before the copy is trusted (:func:`verify`, on
the source and on the copy); damage refuses the backup.

A **restore** makes one member's data directory from a backup: the log (cut at
``--to-position`` if given, at a record's end, from the backup's oldest snapshot on:
point-in-time, for an incident), the recording log (terms and snapshots after the cut
removed), the snapshot, ``node-state.json`` (the
commit position the backup covers, or the cut) and ``member.json`` (the member id
given, voting).  Each member of the new cluster is restored from the same backup with
its own ``--member-id``: they get the same cluster id (``backup.json``'s
``new_cluster_id``, drawn when the backup was made), or with ``--same-cluster`` the
source's, to replace lost members of the existing cluster; that is refused unless the
backup covers the commit position the operator says the cluster reached
(``--cluster-commit``).  A restored member starts with the same command line as any
other, with no ``--cluster-id``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ..archive.identity import Identity, write_identity
from ..archive.node_state import NodeState
from ..archive.reader import list_segments, scan_records
from ..archive.record import RECORD_HEADER_LENGTH
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.snapshots import snapshot_path
from ..backup.link import client_identity
from ..backup.oneshot import OneShotError, live_backup
from ..transport.tls import TlsError
from .client import use_certs
from .commands import emit
from .offline import recovery_plan, verify

MANIFEST = "backup.json"
FORMAT = 1
RESTORE_ATTEMPTS = 5
"""A restore from a directory that a running ``cluster-backup`` changed under it is
tried again (it changes every poll, atomically)."""


class BackupError(Exception):
    """The backup or the restore cannot be made as asked (exit 1, the reason in words)."""


class BackupChanged(BackupError):
    """The backup changed under the restore (a running ``cluster-backup``): try again."""


def _saved_commit(node_dir: Path) -> int:
    try:
        return int(json.loads((node_dir / "node-state.json").read_text())["commit_position"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def backup_from_dir(node_dir: Path, out: Path) -> dict[str, Any]:
    """Copy a stopped member's directory to ``out`` as a backup; its manifest."""
    if out.exists() and any(out.iterdir()):
        raise BackupError(f"{out} is not empty: a backup goes to a new directory")
    checked = verify(node_dir)
    if not checked["ok"]:
        damaged = "; ".join(p["problem"] for p in checked["problems"] if not p["torn_tail"])
        raise BackupError(f"{node_dir} is damaged, no backup made: {damaged}")
    plan = recovery_plan(node_dir)
    log_end = plan["log_end"]
    covers = min(log_end, max(_saved_commit(node_dir), plan["replay"]["from"]))
    identity = None
    try:
        member = json.loads((node_dir / "member.json").read_text())
        identity = (int(member["cluster_id"]), int(member["member_id"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    (out / "archive").mkdir(parents=True, exist_ok=True)
    (out / "snapshots").mkdir(exist_ok=True)
    shutil.copyfile(node_dir / "recording.log", out / "recording.log")
    recording = RecordingLog.read(node_dir)
    for entry in recording.snapshots(CM_SERVICE_ID):
        source = snapshot_path(node_dir, entry.log_position, entry.leadership_term_id)
        if source.exists():
            shutil.copyfile(source, out / "snapshots" / source.name)
    for segment in list_segments(node_dir / "archive"):
        shutil.copyfile(segment.path, out / "archive" / segment.path.name)
    copied = verify(out)
    if not copied["ok"]:
        shutil.rmtree(out, ignore_errors=True)
        raise BackupError("the copy does not verify (the source changed under it?): removed")
    manifest = {
        "format": FORMAT,
        "source": str(node_dir),
        "cluster_id": None if identity is None else identity[0],
        "member_id": None if identity is None else identity[1],
        "new_cluster_id": random.randrange(1, 1 << 31),
        "created": time.time(),
        "snapshot": plan["snapshot"]
        and {k: plan["snapshot"][k] for k in ("log_position", "leadership_term_id")},
        "log_start": plan["log_start"],
        "log_end": log_end,
        "covers": covers,
        "records": copied["records"],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _record_end_at_or_below(node_dir: Path, position: int) -> int:
    """The end of the last whole record at or below ``position`` in the log."""
    best = -1
    for segment in list_segments(node_dir / "archive"):
        if segment.base > position:
            break
        best = max(best, segment.base)
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            scan = scan_records(fd, 0, segment.length, segment.base)
            for offset, body in scan:
                end = offset + RECORD_HEADER_LENGTH + len(body)
                if end > position:
                    break
                best = end
        finally:
            os.close(fd)
    return best


def _cut(node_dir: Path, position: int) -> None:
    """Cut the log at ``position`` (a record's end): segments after it removed, the one
    holding it shortened."""
    for segment in list_segments(node_dir / "archive"):
        if segment.base > position:
            segment.path.unlink()
        elif segment.end > position:
            os.truncate(segment.path, position - segment.base)


def restore(
    backup: Path,
    node_dir: Path,
    member_id: int,
    *,
    same_cluster: bool = False,
    cluster_commit: int | None = None,
    to_position: int | None = None,
) -> dict[str, Any]:
    """Make member ``member_id``'s data directory ``node_dir`` from ``backup``."""
    try:
        manifest_bytes = (backup / MANIFEST).read_bytes()
        manifest = json.loads(manifest_bytes)
    except (OSError, ValueError) as exc:
        raise BackupError(f"{backup} is no backup ({MANIFEST}: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{backup}: backup format {manifest.get('format')} is not {FORMAT}")
    if node_dir.exists() and any(node_dir.iterdir()):
        raise BackupError(
            f"{node_dir} is not empty: a member's directory is restored into a new one"
        )
    if same_cluster:
        if cluster_commit is None:
            raise BackupError(
                "--same-cluster needs --cluster-commit P (the cluster's commit position)"
            )
        if manifest["covers"] < cluster_commit:
            raise BackupError(
                f"the backup covers log position {manifest['covers']}, short of the cluster's "
                f"commit {cluster_commit}: restoring it into the same cluster would lose writes"
            )
        if manifest["cluster_id"] is None:
            raise BackupError("the backup does not say which cluster it came from")
    target = manifest["log_end"] if to_position is None else to_position
    checked = verify(backup)
    if not checked["ok"]:
        if (backup / MANIFEST).read_bytes() != manifest_bytes:
            raise BackupChanged(f"{backup} changed while it was checked")
        raise BackupError(f"{backup} does not verify: {checked['problems']}")
    held = [e.log_position for e in RecordingLog.read(backup).snapshots(CM_SERVICE_ID)]
    floor = min(held) if held else manifest["log_start"]
    if to_position is not None and not floor <= to_position <= manifest["log_end"]:
        raise BackupError(
            f"--to-position {to_position} is outside what the backup holds: "
            f"[{floor}, {manifest['log_end']}] (from its oldest snapshot to the end of its log)"
        )
    node_dir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            for part in ("archive", "snapshots"):
                shutil.copytree(backup / part, node_dir / part)
            shutil.copyfile(backup / "recording.log", node_dir / "recording.log")
        except (OSError, shutil.Error) as exc:
            raise BackupChanged(
                f"{backup} changed while it was copied (a running cluster-backup "
                f"dropped a file?): {exc}"
            ) from None
        if to_position is not None:
            end = _record_end_at_or_below(node_dir, to_position)
            if end != to_position:
                raise BackupError(
                    f"--to-position {to_position} is not where a record ends (the last one "
                    f"before it ends at {end})"
                )
        _cut(node_dir, target)  # also what a running cluster-backup appended since
        with RecordingLog.open(node_dir) as recording:
            while (newest := recording.get_latest_snapshot(CM_SERVICE_ID)) is not None and (
                newest.log_position > target
            ):  # a point in time before it: the snapshot before that one
                recording.invalidate_latest_snapshot()
                snapshot_path(node_dir, newest.log_position, newest.leadership_term_id).unlink(
                    missing_ok=True
                )
            recording.remove_terms_from(target + 1)
            last = recording.find_last_term()
            used = recording.get_latest_snapshot(CM_SERVICE_ID)
        snapshot = used and {
            "log_position": used.log_position,
            "leadership_term_id": used.leadership_term_id,
        }
        commit = target if to_position is not None else min(manifest["covers"], target)
        state = NodeState(node_dir)
        state.save(
            candidate_term_id=-1 if last is None else last.leadership_term_id,
            commit_position=commit,
        )
        cluster_id = manifest["cluster_id"] if same_cluster else manifest["new_cluster_id"]
        write_identity(node_dir, Identity(cluster_id, member_id, voting=True))
    except BaseException:
        shutil.rmtree(node_dir, ignore_errors=True)
        raise
    return {
        "dir": str(node_dir),
        "member_id": member_id,
        "cluster_id": cluster_id,
        "log_end": target,
        "commit_position": commit,
        "snapshot": snapshot,
    }


def cmd_backup(args: Any) -> int:
    try:
        manifest = backup_from_dir(Path(args.from_dir), Path(args.out))
    except BackupError as exc:
        print(f"cluster-tool backup: error: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        emit(manifest)
    else:
        print(
            f"backup of {args.from_dir} in {args.out}: covers log position "
            f"{manifest['covers']} ({manifest['records']} records checked; log "
            f"[{manifest['log_start']}, {manifest['log_end']}), snapshot at "
            f"{manifest['snapshot']['log_position'] if manifest['snapshot'] else 'none'})"
        )
    return 0


def cmd_live_backup(parser: Any, args: Any) -> int:
    """``backup --out DIR [--member N]``: from the live cluster (:mod:`cluster.backup`)."""
    members = parser.members(args.members)
    if args.member is not None and args.member not in {m.member_id for m in members}:
        parser.error(f"--member {args.member} is not in --members")
    try:
        tls = client_identity(args.certs_dir, "cluster-tool")
        use_certs(args.certs_dir)
    except TlsError as exc:
        parser.error(f"--certs-dir: {exc}")
    try:
        manifest = trio.run(
            partial(live_backup, members, Path(args.out), member=args.member, tls=tls,
                    limit=max(args.timeout, 10.0))
        )  # fmt: skip
    except OneShotError as exc:
        print(f"cluster-tool backup: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.output == "json":
        emit(manifest)
    else:
        snapshot = manifest["snapshot"]
        print(
            f"backup of {manifest['source']} in {args.out}: covers log position "
            f"{manifest['covers']} ({manifest['records']} records checked; log "
            f"[{manifest['log_start']}, {manifest['log_end']}), snapshot at "
            f"{snapshot['log_position'] if snapshot else 'none'})"
        )
    return 0


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
            )
            break
        except BackupChanged as exc:  # a running cluster-backup: its next state
            if attempt + 1 < RESTORE_ATTEMPTS:
                time.sleep(0.5)
                continue
            print(f"cluster-tool restore: error: {exc}", file=sys.stderr)
            return 1
        except BackupError as exc:
            print(f"cluster-tool restore: error: {exc}", file=sys.stderr)
            return 1
    if args.output == "json":
        emit(done)
    else:
        print(
            f"member {done['member_id']} of cluster {done['cluster_id']} restored in "
            f"{done['dir']}: log to position {done['log_end']}, commit {done['commit_position']}"
        )
    return 0
