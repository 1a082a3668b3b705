"""Writing whole buffers to file descriptors (the archive, snapshots, certificates),
making a rename, a new file or a new directory durable, and reading a data directory's or
a backup's files: regular files only, no more than their size."""

from __future__ import annotations

import errno
import os
import stat
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


def make_directory(path: str | os.PathLike[str]) -> None:
    """Create the directory ``path`` and any missing parents durably: each directory
    made is then named in its parent, fsynced (a power cut would forget it otherwise,
    and whatever was written in it)."""
    path = Path(path)
    missing = []
    while not path.is_dir() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_directory(directory.parent)


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


class RefusedFile(OSError):
    """A file a reader refuses: a symbolic link or a special file (a device, a FIFO, a
    directory, a socket) where a regular file must be (reading it could follow it out of
    the directory, never end, ``/dev/zero``, or block for ever, a FIFO), or one larger
    than such a file can be."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Open ``path`` read-only as a regular file, never through a symbolic link and never
    blocking (a FIFO); its descriptor and its size when opened, the most a reader should
    take from it.  :class:`RefusedFile` for anything else, ``OSError`` as ``open`` raises."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise not_a_file(path, info.st_mode)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise not_a_file(path, stat.S_IFLNK) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise not_a_file(path, info.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def not_a_file(path: str | os.PathLike[str], mode: int) -> RefusedFile:
    """The refusal of ``path``, whose ``lstat`` mode is ``mode`` (naming a link's target)."""
    what = _kind(mode)
    if stat.S_ISLNK(mode):
        try:
            what += f" (to {os.readlink(path)})"
        except OSError:
            pass
    return RefusedFile(errno.EINVAL, f"{what}, not a regular file: refused", os.fspath(path))


def pread_full(fd: int, size: int, offset: int = 0) -> bytes:
    """``size`` bytes at ``offset`` (fewer only where the file ends sooner): one
    ``pread`` when it gives them all, the usual case."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), no more than
    its size when opened; :class:`RefusedFile` when that is over ``limit``."""
    fd, size = open_regular(path)
    try:
        if limit is not None and size > limit:
            raise RefusedFile(
                errno.EFBIG,
                f"{size} bytes, more than such a file holds ({limit}): refused",
                os.fspath(path),
            )
        return pread_full(fd, size)
    finally:
        os.close(fd)


def copy_regular(source: str | os.PathLike[str], into: str | os.PathLike[str],
                 length: int | None = None, chunk: int = 4 << 20) -> int:  # fmt: skip
    """Copy the regular file ``source`` (see :func:`open_regular`), its first ``length``
    bytes or its size when opened, into the new file ``into``, fsynced; the bytes
    copied (fewer than ``length`` only where ``source`` ends sooner)."""
    fd, size = open_regular(source)
    try:
        length = size if length is None else length
        out = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            offset = 0
            while offset < length:
                data = pread_full(fd, min(chunk, length - offset), offset)
                if not data:
                    break
                write_all(out, data, offset)
                offset += len(data)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return offset
