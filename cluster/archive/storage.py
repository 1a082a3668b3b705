"""The consensus module's durable writes: its :class:`~cluster.core.base.StoragePort`
over the node's recording log, node-state file and identity (``member.json``).

A write that fails (a full disk) never stops the node:

* a **candidate term**, or a catch-up member's promotion to voter, that cannot be saved
  raises
  :class:`~cluster.core.base.StorageError`: the consensus module then neither votes
  with it, nor campaigns with it, nor follows a leader of it;
* a **term's start** (or a truncation's removal of terms) that cannot be recorded is
  kept, in order, and written again before anything else of the recording log and
  before the log bytes that need it: the archive agent calls :meth:`NodeStorage.flush`
  ahead of every append and truncation and retries while it fails.  So the log never
  holds bytes of a term the recording log does not name, and nothing is acknowledged
  (the archive position does not move) until the term is durable.

Every outcome goes to the node's :class:`~cluster.archive.disk.DiskHealth`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..core.base import StorageError
from .disk import DiskHealth
from .identity import Identity, write_identity
from .node_state import NodeState
from .recording_log import RecordingLog


class NodeStorage:
    """Candidate terms go to ``node-state.json``, term starts to the recording log."""

    def __init__(
        self,
        recording_log: RecordingLog,
        node_state: NodeState,
        disk: DiskHealth | None = None,
        *,
        identity: Identity | None = None,
        directory: Path | None = None,
    ) -> None:
        self.recording_log = recording_log
        self.node_state = node_state
        self.disk = disk or DiskHealth(recording_log.path.parent)
        self.identity = identity
        self.directory = directory or recording_log.path.parent
        self.pending: deque[tuple[str, Callable[[], object]]] = deque()
        """Recording-log writes that failed, in order, to be written before any other."""

    def save_candidate_term(self, candidate_term_id: int) -> None:
        try:
            self.node_state.save(candidate_term_id=candidate_term_id)
        except OSError as exc:
            reason = self.disk.failed("node state", exc, f"(candidate term {candidate_term_id})")
            raise StorageError(reason) from exc
        self.disk.succeeded("node state")

    def save_voting(self) -> None:
        identity = self.identity
        if identity is None or identity.voting:
            return
        voting = Identity(identity.cluster_id, identity.member_id, voting=True)
        try:
            write_identity(self.directory, voting)
        except OSError as exc:
            raise StorageError(self.disk.failed("member identity", exc, "(voting)")) from exc
        self.disk.succeeded("member identity")
        self.identity = voting

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        self._write(
            f"(term {leadership_term_id} at {base_position})",
            partial(self._record_term, leadership_term_id, base_position, timestamp),
        )

    def _record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        log = self.recording_log
        existing = log.get_term_entry(leadership_term_id)
        if existing is None or existing.term_base_log_position != base_position:
            if existing is not None:
                log.remove_terms_from(existing.term_base_log_position)
            log.append_term(leadership_term_id, base_position, timestamp)

    def remove_terms_from(self, position: int) -> None:
        self._write(
            f"(terms from {position} removed)",
            partial(self.recording_log.remove_terms_from, position),
        )

    def _write(self, detail: str, write: Callable[[], object]) -> None:
        self.pending.append((detail, write))
        self.flush()

    def flush(self) -> bool:
        """Write what failed before, in order; False if it still fails (the log bytes
        after it must wait)."""
        pending = self.pending
        if not pending:
            return True
        while pending:
            detail, write = pending[0]
            try:
                write()
            except OSError as exc:
                self.disk.failed("recording log", exc, detail)
                return False
            pending.popleft()
        self.disk.succeeded("recording log")
        return True
