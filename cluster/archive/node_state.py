"""``node-state.json``: the member's small durable state outside the log.

* ``candidate_term_id``: the highest term this member has voted in or seen.  It is
  written (and fsynced) before the member acts on it, so a restarted member never votes
  twice in a term.
* ``commit_position``: a lower bound of the cluster's commit position, saved now and then.
  At start-up the member replays its log only up to here; entries after it may not be
  committed, and are applied when the leader says they are.

Writes go to a temporary file that is fsynced and renamed over the old one, then the
directory is fsynced: a crash leaves either the old state or the new one.  A write that
fails (a full disk) raises ``OSError``, removes the temporary file and changes nothing:
the caller retries (the node-state saver) or does not act on it (a candidate term).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ..fileio import replace_file
from .errors import ArchiveCorruptionError

FILE_NAME = "node-state.json"

MAX_VALUE = (1 << 63) - 1
"""The largest term or position a message can carry (Int64): a larger one is never saved
(the member could not send it), and is refused at load with the file named."""


class NodeState:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / FILE_NAME
        self._lock = threading.Lock()
        self.candidate_term_id = -1
        self.commit_position = 0
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                candidate = int(data["candidate_term_id"])
                commit = int(data["commit_position"])
                _check(candidate, commit)
            except (ValueError, KeyError, TypeError) as exc:
                raise ArchiveCorruptionError(
                    str(self.path), 0, f"unreadable node state: {exc}"
                ) from None
            self.candidate_term_id = candidate
            self.commit_position = commit

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
            replace_file(self.path, data)  # nothing half written is left (a full disk)
            self.candidate_term_id = candidate
            self.commit_position = commit


def _check(candidate_term_id: int, commit_position: int) -> None:
    if not -1 <= candidate_term_id <= MAX_VALUE:
        raise ValueError(f"candidate term {candidate_term_id} out of range")
    if not 0 <= commit_position <= MAX_VALUE:
        raise ValueError(f"commit position {commit_position} out of range")
