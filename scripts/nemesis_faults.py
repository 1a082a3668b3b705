"""The fault shapes of ``scripts/nemesis.py``, on the namespaces of
``tests/integration/netns.py`` (one per member, one for the clients, a bridge).

Two tools, both silent drops (nothing is reset, as in a real partition):

- a member's bridge port set down: the member is cut off from everyone, clients
  included (:meth:`FaultLab.port`);
- a ``blackhole`` route in member A's namespace to member B's address: A's packets to B
  are dropped (:meth:`FaultLab.block`); both ways is a cut between the two.  Clients
  are never blocked this way, so a member cut off from the others still hears its
  clients (a deposed leader that clients keep asking).

Shapes (:data:`KINDS`), each chosen by :meth:`FaultLab.apply` given the member that
leads and a seeded ``random.Random``:

``isolate-leader``   the leader's port down;
``split-leader-minority``  the members split in two, the leader in the minority;
``split-leader-majority``  the same, the leader in the majority;
``bridge``           one member sees both halves, the others only their own half;
``one-way``          the leader's packets to the other members dropped (theirs reach it);
``flap``             a member's port down and up every second (``flap`` seconds);
``loss``             30 % of a member's packets dropped at random: needs ``nft``
                     (nftables), which is a Debian package; skipped, with that reason,
                     where it is not installed.

:meth:`FaultLab.heal_all` undoes everything.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from netns import Lab, _run, nft_drop

KINDS = (
    "isolate-leader",
    "split-leader-minority",
    "split-leader-majority",
    "bridge",
    "one-way",
    "flap",
    "loss",
)
NEEDS_NFT = {"loss": "nftables (`nft`) is not installed: random packet loss needs it"}
FLAP_PERIOD = 1.0


@dataclass
class Fault:
    """One fault as done: what, to whom, and when (``time.monotonic()``)."""

    kind: str
    targets: list[int]
    how: str
    leader: int | None
    start: float = 0.0
    heal: float = 0.0
    groups: list[list[int]] = field(default_factory=list)


class FaultLab(Lab):
    """A :class:`~netns.Lab` with the shapes above."""

    def __init__(self, members: int) -> None:
        super().__init__(members)
        self.nft = shutil.which("nft") is not None
        self.blocked: set[tuple[int, int]] = set()
        self.down: set[int] = set()
        self.lossy: set[int] = set()

    def skipped(self, kind: str) -> str | None:
        """Why ``kind`` cannot be done here, or None."""
        if kind in NEEDS_NFT and not self.nft:
            return NEEDS_NFT[kind]
        return None

    # ------------------------------------------------------------------ tools

    def block(self, sender: int, to: int) -> None:
        """Drop ``sender``'s packets to ``to`` (a blackhole route in its namespace)."""
        if (sender, to) not in self.blocked:
            _run("ip", "-n", self.members[sender], "route", "add", "blackhole",
                 f"{self.address(to)}/32")  # fmt: skip
            self.blocked.add((sender, to))

    def unblock(self, sender: int, to: int) -> None:
        if (sender, to) in self.blocked:
            _run("ip", "-n", self.members[sender], "route", "del", "blackhole",
                 f"{self.address(to)}/32")  # fmt: skip
            self.blocked.discard((sender, to))

    def cut(self, left: Sequence[int], right: Sequence[int]) -> None:
        """No packet between a member of ``left`` and one of ``right``, either way."""
        for a in left:
            for b in right:
                self.block(a, b)
                self.block(b, a)

    def port(self, member: int, up: bool) -> None:
        """The member's bridge port up or down (down: cut off from everyone)."""
        _run("ip", "-n", self.bridge, "link", "set", self._port(member), "up" if up else "down")
        if up:
            self.down.discard(member)
        else:
            self.down.add(member)

    def lose(self, member: int, percent: int) -> None:
        nft_drop(self.members[member], "loss", "numgen", "random", "mod", "100", "<", str(percent))
        self.lossy.add(member)

    def heal_all(self) -> None:
        for sender, to in sorted(self.blocked):
            self.unblock(sender, to)
        for member in sorted(self.down):
            self.port(member, up=True)
        for member in sorted(self.lossy):
            ns = self.members[member]
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "loss")
        self.lossy.clear()

    # ------------------------------------------------------------------ shapes

    def apply(
        self, kind: str, leader: int | None, rnd: random.Random, hold: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Fault:  # fmt: skip
        """Do ``kind`` for ``hold`` seconds, then heal; the fault as done."""
        n = len(self.members)
        everyone = list(range(n))
        lead = leader if leader is not None else rnd.randrange(n)
        others = [m for m in everyone if m != lead]
        minority_size = (n - 1) // 2
        fault = Fault(kind, [], "", leader)
        fault.start = time.monotonic()
        if kind == "isolate-leader":
            fault.targets = [lead]
            self.port(lead, up=False)
            fault.how = f"member {lead}'s bridge port down (cut off from members and clients)"
        elif kind in ("split-leader-minority", "split-leader-majority"):
            if kind == "split-leader-minority":
                minority = [lead, *rnd.sample(others, minority_size - 1)]
            else:
                minority = rnd.sample(others, minority_size)
            majority = [m for m in everyone if m not in minority]
            fault.targets = sorted(minority)
            fault.groups = [sorted(minority), sorted(majority)]
            self.cut(minority, majority)
            fault.how = (
                f"minority {sorted(minority)} | majority {sorted(majority)}: blackhole routes "
                f"both ways between them (clients reach all)"
            )
        elif kind == "bridge":
            middle = rnd.choice(everyone)
            rest = [m for m in everyone if m != middle]
            rnd.shuffle(rest)
            half = len(rest) // 2
            left, right = sorted(rest[:half]), sorted(rest[half:])
            self.cut(left, right)
            fault.targets = [middle]
            fault.groups = [left, [middle], right]
            fault.how = f"{left} | {middle} sees both | {right}: blackhole routes between halves"
        elif kind == "one-way":
            for other in others:
                self.block(lead, other)
            fault.targets = [lead]
            fault.how = f"member {lead}'s packets to {others} dropped (theirs reach it)"
        elif kind == "flap":
            target = lead if rnd.random() < 0.5 else rnd.choice(others)
            fault.targets = [target]
            fault.how = f"member {target}'s bridge port down/up every {FLAP_PERIOD:g} s"
            up = True
            ends = fault.start + hold
            while time.monotonic() < ends:
                up = not up
                self.port(target, up=up)
                sleep(min(FLAP_PERIOD, max(0.0, ends - time.monotonic())))
        elif kind == "loss":
            target = rnd.choice(everyone)
            self.lose(target, 30)
            fault.targets = [target]
            fault.how = f"30 % of member {target}'s packets dropped (nft numgen)"
        else:
            raise ValueError(f"unknown fault {kind!r}: one of {', '.join(KINDS)}")
        if kind != "flap":
            sleep(max(0.0, fault.start + hold - time.monotonic()))
        self.heal_all()
        fault.heal = time.monotonic()
        return fault
