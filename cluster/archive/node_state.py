"""``node-state.json``: the member's small durable state outside the log.

* ``candidate_term_id``: the highest term this member has voted in or seen.  It is
  written (and fsynced) before the member acts on it, so a restarted member never votes
  twice in a term.
* ``commit_position``: a lower bound of the cluster's commit position, saved now and then.
  At start-up the member replays its log only up to here; entries after it may not be
  committed, and are applied when the leader says they are.

Writes go to a temporary file that is fsynced and renamed over the old one, then the
directory is fsynced: a crash leaves either the old state or the new one.  A write that
fails raises ``OSError``, removes the temporary file and changes nothing: the caller
retries (the node-state saver) or does not act on it (a candidate term).

**Writable on a full disk** (issue 33).  The temporary file is not made at each write:
it is ``node-state.reserve``, a file of :data:`SLOT_SIZE` bytes written once (at start-up,
or as soon as the disk has room).  A save overwrites it in place (the JSON padded with
spaces to the slot's size: space the file system already gave it), fsyncs it, keeps the
old state file as the next reserve (a hard link) and renames the reserve over the state
file.  So no save needs a free block, and a member whose disk is full (a log, a snapshot
stream) can still save its candidate term and vote.  Where the reserve cannot be made
yet (the disk was full from the start), a save takes the ordinary path above.  (A
copy-on-write file system, btrfs or ZFS, may still need blocks for an overwrite.)
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ..fileio import RefusedFile, fsync_directory, read_regular, replace_file, write_all
from .errors import ArchiveCorruptionError

FILE_NAME = "node-state.json"
RESERVE_NAME = "node-state.reserve"
"""The pre-allocated file the next state is written into."""
SLOT_SIZE = 4096
"""Bytes of the reserve (one block or page): a state is padded to it."""
MAX_FILE = 1 << 20
"""The most a state file is read for (it is one slot): a larger one is damage."""

MAX_VALUE = (1 << 63) - 1
"""The largest term or position a message can carry (Int64): a larger one is never saved
(the member could not send it), and is refused at load with the file named."""


class NodeState:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / FILE_NAME
        self.reserve = self.path.with_name(RESERVE_NAME)
        self._lock = threading.Lock()
        self.candidate_term_id = -1
        self.commit_position = 0
        if self.path.exists():
            try:
                data = json.loads(read_regular(self.path, MAX_FILE))
                candidate = int(data["candidate_term_id"])
                commit = int(data["commit_position"])
                _check(candidate, commit)
            except (RefusedFile, ValueError, KeyError, TypeError) as exc:
                raise ArchiveCorruptionError(
                    str(self.path), 0, f"unreadable node state: {exc}"
                ) from None
            self.candidate_term_id = candidate
            self.commit_position = commit
        old = self.reserve.with_suffix(".old")
        if old.exists():  # a save cut short between its two renames
            if self.reserve.exists():
                old.unlink()
            else:
                os.replace(old, self.reserve)
        self.ensure_reserve()

    def ensure_reserve(self) -> bool:
        """Make the reserve if it is missing (False: no room for it yet)."""
        if self.reserve.exists():
            return True
        try:
            replace_file(self.reserve, b" " * SLOT_SIZE)
        except OSError:
            return False
        return True

    def save(
        self, *, candidate_term_id: int | None = None, commit_position: int | None = None
    ) -> None:
        """Write the state with the given fields changed; the fields change in memory only
        once the file is durable.  Thread-safe: the node saves the commit position from a
        worker thread while its event loop may save a candidate term."""
        with self._lock:
            candidate = self.candidate_term_id if candidate_term_id is None else candidate_term_id
            commit = self.commit_position if commit_position is None else commit_position
            _check(candidate, commit)
            data = json.dumps({"candidate_term_id": candidate, "commit_position": commit}).encode()
            if len(data) > SLOT_SIZE or not self.ensure_reserve():
                replace_file(self.path, data)  # nothing half written is left (a full disk)
            else:
                self._save_in_reserve(data)
            self.candidate_term_id = candidate
            self.commit_position = commit
            self.ensure_reserve()  # the first save used it; or the disk has room again

    def _save_in_reserve(self, data: bytes) -> None:
        """Write ``data`` into the reserve's blocks and rename it over the state file;
        the old state file becomes the reserve (nothing is allocated or freed)."""
        reserve, path = self.reserve, self.path
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_CLOEXEC)
            try:
                write_all(fd, data.ljust(SLOT_SIZE))  # JSON allows the trailing spaces
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            reserve.unlink(missing_ok=True)  # made again when the disk takes it
            raise
        old = reserve.with_suffix(".old")
        if path.exists():
            old.unlink(missing_ok=True)
            os.link(path, old)  # the old state's blocks stay allocated
        os.replace(reserve, path)
        if old.exists():
            os.replace(old, reserve)
        fsync_directory(path.parent)


def _check(candidate_term_id: int, commit_position: int) -> None:
    if not -1 <= candidate_term_id <= MAX_VALUE:
        raise ValueError(f"candidate term {candidate_term_id} out of range")
    if not 0 <= commit_position <= MAX_VALUE:
        raise ValueError(f"commit position {commit_position} out of range")
