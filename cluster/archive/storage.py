"""The consensus module's durable writes: its :class:`~cluster.core.base.StoragePort`
over the node's recording log and node-state file."""

from __future__ import annotations

from .node_state import NodeState
from .recording_log import RecordingLog


class NodeStorage:
    """Candidate terms go to ``node-state.json``, term starts to the recording log."""

    def __init__(self, recording_log: RecordingLog, node_state: NodeState) -> None:
        self.recording_log = recording_log
        self.node_state = node_state

    def save_candidate_term(self, candidate_term_id: int) -> None:
        self.node_state.save(candidate_term_id=candidate_term_id)

    def record_term(self, leadership_term_id: int, base_position: int, timestamp: int) -> None:
        log = self.recording_log
        existing = log.get_term_entry(leadership_term_id)
        if existing is None or existing.term_base_log_position != base_position:
            if existing is not None:
                log.remove_terms_from(existing.term_base_log_position)
            log.append_term(leadership_term_id, base_position, timestamp)

    def remove_terms_from(self, position: int) -> None:
        self.recording_log.remove_terms_from(position)
