"""Snapshot files: ``DIR/snapshots/snapshot-<log position>-<term>.snap``.

A snapshot file is a sequence of log-format records (``u32 length | u32 crc32 | body``)
whose bodies are encoded snapshot messages (:data:`cluster.protocol.SNAPSHOT`): the
consensus module's section then the service's, each between SnapshotMarker BEGIN and END.
It is written to a temporary file, fsynced, renamed into place and the directory fsynced
before the recording log names it, so a snapshot that the recording log lists is whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..fileio import fsync_directory, make_directory, read_regular, write_all
from ..protocol.codec import SNAPSHOT, encode
from ..protocol.errors import ProtocolError
from ..protocol.snapshot import SnapshotRecord
from .errors import ArchiveCorruptionError
from .record import RecordError, append_record, complete_length, iter_records


def snapshot_path(directory: str | os.PathLike[str], log_position: int, term: int) -> Path:
    return Path(directory) / "snapshots" / f"snapshot-{log_position:020d}-{term}.snap"


def encode_snapshot(records: Iterable[Any]) -> bytes:
    buf = bytearray()
    for record in records:
        append_record(buf, encode(record))
    return bytes(buf)


def write_snapshot(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: an error (a full disk) removes
    the temporary file and is raised."""
    make_directory(path.parent)  # the first snapshot makes it: durably
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # it would eat the space an operator frees
        raise
    fsync_directory(path.parent)


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of snapshots whose writing was cut short (a crash,
    a full disk); returns them.  Run at start-up, before any snapshot is written."""
    removed = []
    for tmp in sorted((Path(directory) / "snapshots").glob("*.tmp")):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def read_snapshot(path: Path) -> list[SnapshotRecord]:
    """Every record of a snapshot file; damage raises ArchiveCorruptionError, and so
    does a link or a special file in its place (never followed: a snapshot linked to
    ``/dev/zero`` would be read for ever)."""
    try:
        data = read_regular(path)
    except OSError as exc:
        reason = f"cannot read snapshot: {exc.strerror or exc}"
        raise ArchiveCorruptionError(path, 0, reason) from None
    records: list[SnapshotRecord] = []
    try:
        for offset, body in iter_records(data):
            try:
                records.append(SNAPSHOT.decode(body))
            except ProtocolError as exc:
                raise ArchiveCorruptionError(path, offset, str(exc)) from None
    except RecordError as exc:
        raise ArchiveCorruptionError(path, exc.offset, exc.reason) from None
    if complete_length(data) != len(data):
        raise ArchiveCorruptionError(path, complete_length(data), "truncated snapshot")
    return records
