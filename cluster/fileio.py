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
