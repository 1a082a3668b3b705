"""Writing whole buffers to file descriptors (the archive, snapshots, certificates)."""

from __future__ import annotations

import errno
import os


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` at the descriptor's offset; ``OSError`` (a full disk, or a
    write that makes no progress) if it cannot."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]
