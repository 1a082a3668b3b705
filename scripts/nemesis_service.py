"""The service of ``scripts/nemesis.py``: the register of the history tests
(``tests/integration/register_service.py``: ``set KEY VALUE``; queries ``get KEY``,
``at KEY``) and one more query, ``digest``: the member that answers, the log position
its state reflects and the SHA-256 of that state (its snapshot), so that the run can
compare every member's state once healed."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from register_service import RegisterService


class NemesisService(RegisterService):
    def on_query(self, payload: bytes) -> bytes:
        if payload == b"digest":
            assert self.cluster is not None
            state = self.on_take_snapshot()
            digest = hashlib.sha256(state).hexdigest()[:16]
            return (
                f"{self.cluster.member_id} {self.cluster.log_position} {self.sets} {digest}"
            ).encode()
        return super().on_query(payload)
