"""Quorum arithmetic, in one place (etcd-io/raft's ``quorum`` package, for a majority).

A cluster of ``n`` members decides with ``n // 2 + 1`` of them: an entry is committed
once that many members have it durably appended, and a candidate wins once that many
have voted for it.  Every count in the core goes through these functions.
"""

from __future__ import annotations

from collections.abc import Iterable


def threshold(member_count: int) -> int:
    """How many members make a quorum of ``member_count``."""
    return member_count // 2 + 1


def committed(positions: Iterable[int], member_count: int) -> int:
    """The highest position that a quorum of the members holds: ``positions`` has one
    entry per member (missing members count as holding nothing)."""
    ordered = sorted(positions, reverse=True)
    k = threshold(member_count) - 1
    return ordered[k] if k < len(ordered) else 0


def has_quorum(count: int, member_count: int) -> bool:
    """Do ``count`` members (votes, active followers plus the leader...) make a quorum?"""
    return count >= threshold(member_count)
