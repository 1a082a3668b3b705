"""The banner's verdict on the cluster: what the leader's module is doing, or why there
is no leader (see :attr:`tui.model.ClusterModel.headline`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from cluster.transport.tls import TLS_REQUIRED, is_tls_problem

__all__ = ["STOPPING", "Headline", "fmt_int", "headline", "tls_state"]

STOPPING = ("QUITTING", "TERMINATING", "CLOSED")
"""Module states of a member on its way out."""


def tls_state(error: str) -> str:
    """A member's TLS trouble (:func:`~cluster.transport.tls.is_tls_problem`) in a word
    or two: TLS REQUIRED (we came without certificates), else TLS FAILED."""
    return "TLS REQUIRED" if TLS_REQUIRED in error or "require TLS" in error else "TLS FAILED"


def fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


class MemberRow(Protocol):
    """What the verdict reads of a member's row (:class:`tui.model.MemberRow`)."""

    member_id: int
    known: bool
    up: bool
    role: str
    term: int | None
    commit: int | None
    election: str
    module: str
    error: str


@dataclass(frozen=True, slots=True)
class Headline:
    """The banner's verdict: ``state`` in a badge, then ``detail``; ``tone`` is ok, info,
    warn or bad."""

    state: str
    detail: str
    tone: str


def headline(
    members: Mapping[int, MemberRow],
    leader_id: int | None,
    stopped_at: float | None,
    stopped_clean: bool,
) -> Headline:
    """The leader's module state when there is a leader (SUSPENDED, SNAPSHOT, SHUTTING
    DOWN, else LEADER); without one: connecting, the cluster stopped or shut down, a
    member shutting down, no member answering (or TLS REQUIRED / TLS FAILED when the
    members turn us away for our certificates or their lack), an election, or no
    quorum."""
    rows = list(members.values())
    leader = members[leader_id] if leader_id is not None else None
    if leader is not None:
        where = f"leader member {leader.member_id}, term {leader.term}"
        module = leader.module
        if module == "SUSPENDED":
            return Headline("SUSPENDED", f"{where}: ingress held until resumed (r)", "warn")
        if module == "SNAPSHOT":
            return Headline("SNAPSHOT", f"{where}: taking a snapshot", "info")
        if module in STOPPING:
            return Headline("SHUTTING DOWN", f"{where}: module {module}", "info")
        if module not in ("ACTIVE", "-"):
            return Headline(module, where, "warn")
        return Headline(
            f"LEADER member {leader.member_id}",
            f"term {leader.term}  commit position {fmt_int(leader.commit)}",
            "ok",
        )
    if not any(m.known for m in rows):
        return Headline("CONNECTING", "asking the admin ports...", "warn")
    if stopped_at is not None:
        if stopped_clean:
            return Headline("SHUT DOWN", "every member stopped after a shutdown", "info")
        return Headline(
            "STOPPED", "every member stopped at once (a shutdown?); none said why", "warn"
        )
    stopping = [m for m in rows if m.up and m.module in STOPPING]
    if stopping:
        m = stopping[0]
        return Headline("SHUTTING DOWN", f"member {m.member_id}: module {m.module}", "info")
    up = [m for m in rows if m.up]
    if not up:
        tls = [m.error for m in rows if m.known and is_tls_problem(m.error)]
        if tls:  # not a dead cluster: we cannot talk to it (no --certs-dir, the wrong one)
            return Headline(tls_state(tls[0]), tls[0], "bad")
        return Headline("NO LEADER", "no member answers", "bad")
    electing = [m for m in up if m.role == "CANDIDATE" or m.election not in ("CLOSED", "-")]
    if electing:
        m = electing[0]
        return Headline(
            "NO LEADER", f"election in progress (member {m.member_id}: {m.election})", "bad"
        )
    return Headline("NO LEADER", "no member leads (no quorum, or no election yet)", "bad")
