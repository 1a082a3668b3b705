"""Members in network namespaces of their own, for partitions of real processes (issue 44,
item 1).

:func:`lab` (as root) makes one namespace per member and one for the clients, each with
a veth pair whose other end is a port of a bridge inside a namespace of its own: nothing
is added to the host's namespace, and the addresses (``10.77.0.x/24``) exist only inside
these namespaces.  Members run with ``ip netns exec`` (:meth:`Lab.command`), and so do
the test's clients (a helper process in the client namespace): nothing dials these
addresses from outside.

A partition: ``nft`` drop rules inside the member's namespace where ``nft`` is installed,
else the member's bridge port is set down (:meth:`Lab.isolate`; isolation of one member
only).  Either way packets are dropped, nothing is reset.  :meth:`Lab.split` cuts a
member off from the other members only, its clients still reaching it (a deposed
leader that clients can still ask): ``blackhole`` routes in both directions, which drop
silently.

:func:`unavailable` says why a lab cannot be made here (not root, no ``ip``, no
namespaces); the tests skip with that reason.  Every namespace is deleted when the
``with`` ends, whatever happened (its processes are the caller's to stop first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SUBNET = "10.77.0"
HEARTBEAT_TIMEOUT = 1.0
"""The leader heartbeat timeout of members run in namespaces (seconds)."""
NODE_ARGS = [
    "--insecure",  # plaintext on addresses that exist only inside the namespaces
    "--leader-heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}s",
    "--leader-heartbeat-interval", "100ms",
    "--election-timeout", "500ms",
]  # fmt: skip
"""The members' settings in the namespace tests and the nemesis (faults of seconds)."""
CLIENT_HOST = 100


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def nft_drop(ns: str, table: str, *match: str) -> None:
    """An nftables table ``table`` in namespace ``ns`` that drops the packets to and from
    the members' subnet (those of them that also match ``match``, e.g. a random share)."""
    _run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", table)
    for hook in ("input", "output"):
        _run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", table, hook,
             f"{{ type filter hook {hook} priority 0 ; }}")  # fmt: skip
        side = "saddr" if hook == "input" else "daddr"
        _run("ip", "netns", "exec", ns, "nft", "add", "rule", "inet", table, hook,
             "ip", side, f"{SUBNET}.0/24", *match, "drop")  # fmt: skip


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"tri-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class Lab:
    """The namespaces of ``members`` members, the clients and the bridge."""

    def __init__(self, members: int) -> None:
        tag = f"tri{os.getpid() % 100000}"
        self.bridge = f"{tag}-br"
        self.clients = f"{tag}-c"
        self.members = [f"{tag}-m{i}" for i in range(members)]
        self.nft = shutil.which("nft") is not None
        self.made: list[str] = []

    def address(self, member_id: int) -> str:
        return f"{SUBNET}.{11 + member_id}"

    @property
    def client_address(self) -> str:
        return f"{SUBNET}.{CLIENT_HOST}"

    def _port(self, index: int) -> str:
        return f"b{index}"

    def create(self) -> None:
        for ns in (self.bridge, *self.members, self.clients):
            _run("ip", "netns", "add", ns)
            self.made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
        ends = [(ns, self.address(i)) for i, ns in enumerate(self.members)]
        ends.append((self.clients, self.client_address))
        for index, (ns, address) in enumerate(ends):
            port = self._port(index)
            _run("ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", port,
                 "netns", self.bridge)  # fmt: skip
            _run("ip", "-n", self.bridge, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.bridge, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "v0")
            _run("ip", "-n", ns, "link", "set", "v0", "up")

    def destroy(self) -> None:
        for ns in reversed(self.made):
            _run("ip", "netns", "del", ns, check=False)
        self.made.clear()

    def command(self, ns: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def isolate(self, member_id: int) -> str:
        """Drop every packet to and from the member (nothing reset); how it was done."""
        ns = self.members[member_id]
        if self.nft:
            nft_drop(ns, "cut")
            return "nft drop rules in its namespace"
        _run("ip", "-n", self.bridge, "link", "set", self._port(member_id), "down")
        return "its bridge port set down"

    def split(self, member_id: int) -> str:
        """Drop the packets between the member and every other member, both ways (not
        those of the clients): blackhole routes, silent as a partition is."""
        for other in range(len(self.members)):
            if other != member_id:
                for ns, to in ((member_id, other), (other, member_id)):
                    _run("ip", "-n", self.members[ns], "route", "add", "blackhole",
                         f"{self.address(to)}/32")  # fmt: skip
        return "blackhole routes between it and the other members"

    def unsplit(self, member_id: int) -> None:
        for other in range(len(self.members)):
            if other != member_id:
                for ns, to in ((member_id, other), (other, member_id)):
                    _run("ip", "-n", self.members[ns], "route", "del", "blackhole",
                         f"{self.address(to)}/32")  # fmt: skip

    def heal(self, member_id: int) -> None:
        ns = self.members[member_id]
        if self.nft:
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "cut")
        else:
            _run("ip", "-n", self.bridge, "link", "set", self._port(member_id), "up")


@contextmanager
def lab(members: int = 3) -> Iterator[Lab]:
    """A :class:`Lab`, made, and deleted when the ``with`` ends (even on a failure)."""
    made = Lab(members)
    try:
        made.create()
        yield made
    finally:
        made.destroy()
