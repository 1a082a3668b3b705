"""Exceptions raised by the archive (segment files) and the recording log."""

from __future__ import annotations

import os


class ArchiveError(Exception):
    """Base class of every archive failure."""


class ArchiveCorruptionError(ArchiveError):
    """Data on disk fails a check that a torn write cannot explain; do not repair silently.

    ``path`` is the file holding the bad data and ``position`` the global log position (for
    a segment) or the byte offset (for ``recording.log``) where it starts.
    """

    def __init__(self, path: str | os.PathLike[str], position: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.position = position
        self.reason = reason
        super().__init__(f"{self.path}: corruption at position {position}: {reason}")

    def __reduce__(self) -> tuple[type[ArchiveCorruptionError], tuple[str, int, str]]:
        return type(self), (self.path, self.position, self.reason)


class ArchiveWriteError(ArchiveError, OSError):
    """A write, sync or truncation failed (ENOSPC, EIO, ...).

    It is an :class:`OSError` carrying the original ``errno``. When it comes from
    :meth:`Archive.append`, the archive has been rolled back to its previous position, so
    the append may be retried once the cause is fixed.
    """
