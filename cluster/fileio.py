"""Writing whole buffers to file descriptors (the archive, snapshots, certificates), and
making a rename or a new file in a directory durable."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int | None = None) -> None:
    """Write all of ``data`` at the descriptor's offset, or at ``offset`` in the file
    (``pwrite``: no seek first); ``OSError`` (a full disk, or a write that makes no
    progress) if it cannot."""
    view = memoryview(data)
    while view:
        if offset is None:
            written = os.write(fd, view)
        else:
            written = os.pwrite(fd, view, offset)
            offset += written
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def fsync_directory(directory: str | os.PathLike[str] | Path) -> None:
    """fsync ``directory`` itself, so the names created, renamed or removed in it last."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(directory, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Make ``path`` hold ``data``, durably and all at once: a temporary file beside it,
    fsynced, renamed over it, then the directory fsynced.  A crash leaves the old
    contents or the new; a failure (a full disk) raises ``OSError`` and leaves the old
    contents and no temporary file."""
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
