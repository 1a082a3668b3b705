"""The one loop that drives a consensus module (etcd-io/raft's ``Ready``/``Advance``).

After the consensus module has taken input (messages, a tick, a report), the shell calls
:func:`drive`, which hands each output to the shell and reports back what the shell did,
until nothing is left to do:

1. events (role changes, leader ready, refused members) go to :meth:`Shell.on_event`;
2. the log to persist (new records, a truncation) goes to :meth:`Shell.persist`, which
   writes it now or starts writing it, and reports what became durable
   (``on_archive_position``, ``on_truncated``);
3. queued messages go out (:meth:`Shell.flush`): a follower's acknowledgement of what
   it has just written leaves before it applies anything;
4. the committed log is applied, one chunk at a time (:meth:`Shell.apply`), each chunk
   reported (``on_applied``) and followed by the module's cycle work (leader
   readiness, timers, service messages, read rounds), which may produce more to
   persist and apply;
5. queries whose read round is confirmed and whose read index is applied, and follower
   queries this member has applied far enough for, are answered from the service
   (:meth:`Shell.answer_queries`, :mod:`cluster.core.reads`,
   :mod:`cluster.core.follower_reads`).

The node, the deterministic simulator (which runs real nodes) and the unit harness of
the core all use this loop; only their shells differ.  Nothing here blocks: a shell
whose write must wait (a writer thread) starts it in ``persist`` and calls
:func:`drive` again once it is done.
"""

from __future__ import annotations

from typing import Protocol

from .base import Event
from .consensus import ConsensusModule


class Shell(Protocol):
    """What the driver needs of whatever runs a consensus module."""

    @property
    def applied_position(self) -> int:
        """How far the service has applied the log."""

    def on_event(self, event: Event) -> None:
        """React to a role change or a leader becoming ready."""

    def persist(self) -> None:
        """Take the module's new log (and any truncation) and write it, or start to."""

    def apply(self, commit_position: int) -> bool:
        """Apply the next chunk of the committed log; False if nothing could be."""

    def flush(self) -> None:
        """Send what is queued for members and clients."""

    def answer_queries(self) -> None:
        """Answer the confirmed queries (``cm.reads.ready``) and the follower queries
        (``cm.reads.follower``) the service has applied far enough for."""


def drive(cm: ConsensusModule, shell: Shell, now_ns: int) -> None:
    """Carry out everything the consensus module has for the shell (see above)."""
    while True:
        for event in cm.take_events():
            shell.on_event(event)
        shell.persist()
        if cm.commit_position <= shell.applied_position:
            break
        shell.flush()
        if not shell.apply(cm.commit_position):
            break
        cm.on_applied(shell.applied_position, now_ns)
        cm.consensus_work(now_ns)
    if cm.reads.answerable:
        shell.answer_queries()
    shell.flush()
