"""The archive directory's layout operations behind compaction and snapshot installs:
replacing the whole log with an empty one (built beside it, renamed into place),
finishing a replacement a crash cut short, deleting segments below the log start.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ..fileio import fsync_directory
from .errors import ArchiveCorruptionError
from .reader import SegmentInfo, segment_name

logger = logging.getLogger("cluster.archive")

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_RESET_SUFFIX = ".reset"
_OLD_SUFFIX = ".old"


def finish_reset(directory: Path) -> None:
    """Tidy up after a :meth:`Archive.reset` that a crash cut short."""
    fresh = directory.with_name(directory.name + _RESET_SUFFIX)
    old = directory.with_name(directory.name + _OLD_SUFFIX)
    if not directory.exists() and fresh.is_dir():
        os.rename(fresh, directory)  # crashed between the two renames
        fsync_directory(directory.parent)
        logger.warning("%s: finished replacing the log (cut short by a crash)", directory)
    for leftover in (fresh, old):
        if leftover.exists():
            shutil.rmtree(leftover)
            logger.warning("%s: removed, left by a log reset cut short", leftover)


def reset_directory(directory: Path, position: int) -> Path:
    """Replace the archive in ``directory`` with an empty one beginning at ``position``;
    return its one segment.  Built beside it and renamed into place."""
    fresh = directory.with_name(directory.name + _RESET_SUFFIX)
    old = directory.with_name(directory.name + _OLD_SUFFIX)
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    segment = fresh / segment_name(position)
    fd = os.open(segment, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    os.fsync(fd)
    os.close(fd)
    fsync_directory(fresh)
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.rename(directory, old)
    os.rename(fresh, directory)
    fsync_directory(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory / segment.name


def drop_below(directory: Path, segments: list[SegmentInfo], start: int) -> list[SegmentInfo]:
    """Delete the segments wholly below ``start`` (a purge a crash cut short; the
    last segment is kept); with none left, the log begins, empty, at ``start``."""
    if start <= 0:
        return segments
    doomed = [s for s in segments[:-1] if s.end <= start]
    for segment in doomed:
        segment.path.unlink()
        logger.warning("%s: deleted, below the log start %d", segment.path, start)
    if doomed:
        fsync_directory(directory)
    kept = segments[len(doomed) :]
    if not kept:
        path = directory / segment_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
        os.close(fd)
        fsync_directory(directory)
        kept = [SegmentInfo(start, path, 0)]
    elif kept[0].base > start:
        raise ArchiveCorruptionError(
            kept[0].path,
            start,
            f"the log begins at {start} but its first segment at {kept[0].base}",
        )
    return kept
