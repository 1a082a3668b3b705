"""EchoService: replies to every message with the same payload (used by the benchmark)."""

from __future__ import annotations

from ..service import ClientSession, Cluster, ClusteredService


class EchoService(ClusteredService):
    """Echoes each client message back; counts the messages (its only state)."""

    def __init__(self) -> None:
        self.messages = 0

    def on_start(self, cluster: Cluster, snapshot: bytes | None) -> None:
        if snapshot:
            self.messages = int.from_bytes(snapshot, "little")

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, payload: bytes
    ) -> None:
        self.messages += 1
        if session is not None:
            session.offer(payload)

    def on_take_snapshot(self) -> bytes:
        return self.messages.to_bytes(8, "little")
