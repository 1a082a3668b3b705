"""``cluster-tool backup``: a backup of a stopped member's directory (``--from-dir``)
or of the live cluster (over the admin port, :mod:`cluster.backup.oneshot`); the
restore is :mod:`cluster.tool.restore` (issue 34).

A **backup** is a directory holding what a start of a member needs: the member's
``recording.log`` (its terms and snapshots), its latest valid snapshot(s) and its log
segments (from the first one it holds: compaction keeps it bounded), and ``backup.json``
(:mod:`cluster.backup.manifest`): where it came from, the snapshot it starts from, the
log it holds and the position it **covers**: the commit position the member had saved
(``node-state.json``), never more than its log.  Every record is checked before the
copy is made and the copy against its manifest after (:func:`verify`); damage refuses
the backup.  Only regular files are copied, no more than the sizes checked.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ..archive.errors import ArchiveError
from ..archive.reader import list_segments
from ..archive.recording_log import CM_SERVICE_ID, RecordingLog
from ..archive.snapshots import snapshot_path
from ..backup.link import client_identity
from ..backup.manifest import FORMAT, KIND_OFFLINE, MANIFEST
from ..backup.oneshot import OneShotError, live_backup
from ..fileio import copy_regular, read_regular, replace_file
from ..transport.tls import TlsError
from .client import use_certs
from .commands import emit
from .offline import recovery_plan, verify

MAX_STATE = 1 << 20
"""The most ``node-state.json`` or ``member.json`` is read for (they are bytes)."""


class BackupError(Exception):
    """The backup cannot be made as asked (exit 1, the reason in words)."""


def _saved_commit(node_dir: Path) -> int:
    try:
        state = json.loads(read_regular(node_dir / "node-state.json", MAX_STATE))
        return int(state["commit_position"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def backup_from_dir(node_dir: Path, out: Path) -> dict[str, Any]:
    """Copy a stopped member's directory to ``out`` as a backup; its manifest."""
    if out.exists() and any(out.iterdir()):
        raise BackupError(f"{out} is not empty: a backup goes to a new directory")
    checked = verify(node_dir)
    if not checked["ok"]:
        damaged = "; ".join(f"{p['file']}: {p['problem']}" for p in checked["problems"]
                            if not p["note"])  # fmt: skip
        raise BackupError(f"{node_dir} is damaged, no backup made: {damaged}")
    plan = recovery_plan(node_dir)
    log_end = plan["log_end"]
    if checked["records_end"] is not None:  # a torn tail is left behind: a start cuts it
        log_end = min(log_end, checked["records_end"])
    covers = min(log_end, max(_saved_commit(node_dir), plan["replay"]["from"]))
    identity = None
    try:
        member = json.loads(read_regular(node_dir / "member.json", MAX_STATE))
        identity = (int(member["cluster_id"]), int(member["member_id"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    (out / "archive").mkdir(parents=True, exist_ok=True)
    (out / "snapshots").mkdir(exist_ok=True)
    try:  # regular files only, to the sizes checked
        recording = RecordingLog.read(node_dir)  # a torn last entry left behind too
        copy_regular(node_dir / "recording.log", out / "recording.log", recording.torn_at)
        for entry in recording.snapshots(CM_SERVICE_ID):
            source = snapshot_path(node_dir, entry.log_position, entry.leadership_term_id)
            copy_regular(source, out / "snapshots" / source.name)
        for segment in list_segments(node_dir / "archive"):
            if segment.base <= log_end:
                copy_regular(segment.path, out / "archive" / segment.path.name,
                             min(segment.length, log_end - segment.base))  # fmt: skip
    except (OSError, ArchiveError) as exc:
        shutil.rmtree(out, ignore_errors=True)
        raise BackupError(
            f"copying {node_dir} failed (it changed under the copy?): {exc}"
        ) from None
    manifest = {
        "format": FORMAT,
        "kind": KIND_OFFLINE,
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
        "records": checked["records"],
    }
    replace_file(out / MANIFEST, json.dumps(manifest, indent=2).encode())
    copied = verify(out)  # the manifest's promises too
    if not copied["ok"]:
        shutil.rmtree(out, ignore_errors=True)
        damaged = "; ".join(f"{p['file']}: {p['problem']}" for p in copied["problems"]
                            if not p["note"])  # fmt: skip
        raise BackupError(f"the copy does not verify (the source changed under it?), "
                          f"removed: {damaged}")  # fmt: skip
    return manifest


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
