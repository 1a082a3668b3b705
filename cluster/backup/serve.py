"""The member's side of a backup: the admin commands ``backup-query`` and ``backup-read``.

A backup (``cluster-tool backup --out``, ``cluster-backup``) pulls what it needs from a
member over the admin connection, in bounded chunks, and writes it itself; the member
only answers reads, so a backup never votes, never counts toward a quorum and adds no
work to the leader's write path.  Both commands read the member's whole state, so the
admin server refuses them like the commands that change the cluster: only from a
loopback address or, with TLS, an admin principal.

- ``backup-query [brief=1]``: JSON: the member (id, cluster id, role, leader, term), its commit
  position and ``readable_end`` (what ``backup-read`` will serve: the commit position,
  never more than the log it holds), where its log begins, its recording log's terms and
  its valid snapshots (position, term, term base, time, file size); ``brief=1``: only
  the member, its role, leader and positions (cheap, for a poll).
- ``backup-read kind=snapshot position=P term=T offset=O [length=N]``: raw bytes of that
  snapshot file; ``kind=log from=P stop=S [length=N]``: raw log bytes from ``P`` (a
  record's start) up to ``S`` (at most the commit position), whole records only, at
  most ``length`` (:data:`MAX_CHUNK`) unless one record is longer.  File reads run in a
  worker thread; the log is read under the archive lock, so a compaction never deletes
  a segment half-way through a read.  A file gone meanwhile (a snapshot removed by
  compaction, log below the start after a purge) is an ``ok=False`` reply in words: the
  backup asks ``backup-query`` again.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from .. import __version__
from ..archive.errors import ArchiveError
from ..archive.identity import Identity
from ..archive.record import RECORD_HEADER, RECORD_HEADER_LENGTH, complete_length
from ..archive.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, RecordingLog
from ..archive.segments import Archive
from ..archive.snapshots import snapshot_path
from ..core.consensus import ConsensusModule
from ..fileio import open_regular
from ..protocol.admin import AdminCommand, AdminReply, encode_body
from ..status import role_name

COMMANDS = ("backup-query", "backup-read")
MAX_CHUNK = 1 << 20
"""The most bytes one ``backup-read`` answers (a single longer record is sent whole)."""


class BackupSource(Protocol):
    """What the two commands need of a node."""

    @property
    def data_dir(self) -> Path: ...

    @property
    def recording_log(self) -> RecordingLog: ...

    identity: Identity
    archive: Archive
    run_blocking: Callable[..., Awaitable[Any]]

    cm: ConsensusModule

    async def read_log(self, start: int, stop: int) -> bytes: ...


class ReadRefused(Exception):
    """The read cannot be answered (the reason in words)."""


def _int(command: AdminCommand, name: str, default: int | None = None) -> int:
    text = command.args.get(name)
    if text is None:
        if default is None:
            raise ReadRefused(f"{command.command}: {name}=N is missing")
        return default
    try:
        return int(text)
    except ValueError:
        raise ReadRefused(f"{command.command}: bad {name} {text!r}") from None


def readable_end(node: BackupSource) -> int:
    """How far ``backup-read`` serves the log: the commit position, never past the
    log this member holds (cheap: read for every chunk)."""
    log = node.cm.log
    held = max(log.published_position, log.archive_position, node.archive.position)
    return max(0, min(log.commit_position, held))


def brief(node: BackupSource) -> dict[str, Any]:
    """``backup-query brief=1``: who this member is and its commit position (what the
    continuous backup asks the leader at every poll)."""
    cm = node.cm
    return {
        "member_id": cm.config.member_id,
        "cluster_id": node.identity.cluster_id,
        "role": role_name(cm),
        "leader_member_id": cm.leader_member_id,
        "leadership_term_id": cm.leadership_term_id,
        "commit_position": cm.log.commit_position,
        "readable_end": readable_end(node),
        "version": __version__,
    }


def query(node: BackupSource) -> dict[str, Any]:
    """``backup-query``'s body."""
    recording = node.recording_log
    snapshots = []
    for entry in recording.entries:
        if not entry.is_valid or entry.type != ENTRY_TYPE_SNAPSHOT:
            continue
        path = snapshot_path(node.data_dir, entry.log_position, entry.leadership_term_id)
        try:
            info = path.lstat()
        except OSError:
            continue  # removed by compaction since
        if not stat.S_ISREG(info.st_mode):
            continue  # a link or a special file: never served (backup-read refuses it)
        size = info.st_size
        snapshots.append({
            "leadership_term_id": entry.leadership_term_id,
            "term_base_log_position": entry.term_base_log_position,
            "log_position": entry.log_position,
            "timestamp": entry.timestamp,
            "service_id": entry.service_id,
            "size": size,
        })  # fmt: skip
    terms = [
        {
            "leadership_term_id": e.leadership_term_id,
            "term_base_log_position": e.term_base_log_position,
            "log_position": e.log_position,
            "timestamp": e.timestamp,
        }
        for e in recording.entries
        if e.is_valid and e.type == ENTRY_TYPE_TERM
    ]
    return {
        **brief(node),
        "log_start": max(node.archive.start_position, recording.log_start),
        "terms": terms,
        "snapshots": snapshots,
        "max_chunk": MAX_CHUNK,
    }


def _read_file(path: Path, offset: int, length: int) -> bytes:
    fd, _size = open_regular(path)  # never through a link, never a device or a FIFO
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


async def _read_snapshot(node: BackupSource, command: AdminCommand) -> bytes:
    position, term = _int(command, "position"), _int(command, "term")
    offset, length = _int(command, "offset", 0), _int(command, "length", MAX_CHUNK)
    length = max(1, min(length, MAX_CHUNK))
    path = snapshot_path(node.data_dir, position, term)
    try:
        return bytes(await node.run_blocking(_read_file, path, offset, length))
    except FileNotFoundError:
        raise ReadRefused(
            f"snapshot at log position {position} (term {term}) is gone from this member "
            "(compacted or replaced since): ask backup-query again"
        ) from None
    except OSError as exc:
        raise ReadRefused(f"reading {path.name} failed: {exc.strerror or exc}") from None


async def _read_log(node: BackupSource, command: AdminCommand) -> bytes:
    start, stop = _int(command, "from"), _int(command, "stop")
    length = max(1, min(_int(command, "length", MAX_CHUNK), MAX_CHUNK))
    end = readable_end(node)
    if stop > end:
        raise ReadRefused(f"stop {stop} is past this member's committed log ({end})")
    log_start = max(node.archive.start_position, node.recording_log.log_start)
    if start < log_start:
        raise ReadRefused(
            f"log position {start} is below this member's log start {log_start} (compacted): "
            "start from a newer snapshot"
        )
    if start >= stop:
        return b""
    try:
        data = await node.read_log(start, min(stop, start + length))
        whole = complete_length(data)
        if whole == 0 and len(data) >= RECORD_HEADER_LENGTH:  # one record longer than length
            size, _crc = RECORD_HEADER.unpack_from(data)
            need = RECORD_HEADER_LENGTH + size
            if start + need <= stop:
                data = await node.read_log(start, start + need)
                whole = complete_length(data)
    except ValueError as exc:  # the range left the log (a purge or a reset meanwhile)
        raise ReadRefused(f"log [{start}, {stop}) is no longer held here: {exc}") from None
    except ArchiveError as exc:
        raise ReadRefused(f"this member's log is damaged there: {exc}") from None
    except OSError as exc:
        raise ReadRefused(f"reading the log failed: {exc.strerror or exc}") from None
    return data[:whole]


async def handle(node: BackupSource, command: AdminCommand) -> AdminReply:
    """Answer ``backup-query`` or ``backup-read``; refusals are ``ok=False`` replies."""
    cid = command.correlation_id
    try:
        if command.command == "backup-query":
            body = brief(node) if command.args.get("brief") == "1" else query(node)
            return AdminReply(cid, True, "", encode_body(body))
        kind = command.args.get("kind", "")
        if kind == "snapshot":
            return AdminReply(cid, True, "", await _read_snapshot(node, command))
        if kind == "log":
            data = await _read_log(node, command)
            start = _int(command, "from")
            return AdminReply(cid, True, f"log [{start}, {start + len(data)})", data)
        raise ReadRefused(f"backup-read: kind must be snapshot or log, not {kind!r}")
    except ReadRefused as exc:
        return AdminReply(cid, False, str(exc))
