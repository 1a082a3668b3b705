"""Semantic protocol version, packed as Aeron packs it: ``major << 16 | minor << 8 | patch``."""

from __future__ import annotations


def compose(major: int, minor: int, patch: int) -> int:
    """Pack a semantic version into one int."""
    for part in (major, minor, patch):
        if not 0 <= part <= 255:
            raise ValueError(f"version part out of range 0..255: {part}")
    return (major << 16) | (minor << 8) | patch


def major(version: int) -> int:
    return (version >> 16) & 0xFF


def to_string(version: int) -> str:
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


PROTOCOL_VERSION = compose(2, 1, 0)
"""Version of the session protocol; a client, and every member, must share the
cluster's major version.  2: sequenced session messages (exactly once in, issue 42):
a member or client of 1.x would neither number nor check them, so it is refused.
2.1: member links carry keepalives both ways (:data:`LINK_KEEPALIVES`)."""

LINK_KEEPALIVES = compose(2, 1, 0)
"""The first version whose members send a keepalive on each member link, both ways, at
least every heartbeat interval (their hello again), and take one from a peer: a link to
a member of this version or later that hears nothing for a while is closed
(:mod:`cluster.agents.silence`).  A 2.0 member closes a link on a second hello, so none
is sent to it, and its silence is not held against it."""


def is_compatible(client_version: int, cluster_version: int = PROTOCOL_VERSION) -> bool:
    """Aeron's rule: the major versions must match."""
    return major(client_version) == major(cluster_version)
