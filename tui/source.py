"""Where the console's data comes from: the members' admin ports and the client library.

:class:`ClusterSource` is what the app needs; :class:`LiveSource` is the real one:

- queries (``describe``, ``errors``) go over one kept-open
  :class:`~cluster.admin_client.AdminConnection` per member;
- ``suspend`` / ``resume`` go to the leader's admin port (members accept them only from a
  loopback address, and say so otherwise);
- ``snapshot`` is an ``AdminRequest`` SNAPSHOT sent through the client library
  (:func:`client.connect` + :meth:`~client.ClusterClient.request_snapshot`), so the
  answer is the cluster's ``AdminResponse``.  The session is opened at the leader's
  ingress only: a client given every member takes the first connection that opens, and
  a follower answers with a REDIRECT, which the follower counts as a redirected session.
  Only when the member dialled no longer leads is the console redirected
  (``details["redirected"]``).

``describe`` answers are decoded with their type,
:class:`~cluster.protocol.admin.MemberStatus` (:func:`~cluster.protocol.admin.decode_status`).
Snapshot tests give the app a recorded source instead (canned ``describe`` bodies,
converted to :class:`~cluster.protocol.admin.MemberStatus`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import client
from cluster.admin_client import AdminConnection, AdminUnreachable, reply_body
from cluster.admin_client import request as admin_request
from cluster.config import MemberEndpoints, format_ingress_endpoints
from cluster.protocol.admin import AdminReply, MemberStatus, decode_status
from cluster.protocol.errors import ProtocolError

__all__ = [
    "ADMIN_RESPONSE_CODES",
    "ActionResult",
    "ClusterSource",
    "LiveSource",
    "MemberPoll",
    "SourceError",
]


class SourceError(Exception):
    """A member could not be asked (down, refused, timed out) or refused the query."""


@dataclass(slots=True)
class MemberPoll:
    """One ``describe`` of one member: its status, or why there is none."""

    member_id: int
    at: float
    describe: MemberStatus | None = None
    error: str = ""

    @property
    def up(self) -> bool:
        return self.describe is not None


ADMIN_RESPONSE_CODES = ("OK", "ERROR", "UNAUTHORISED_ACCESS")
"""The codes of an ``AdminResponse``; the others (REFUSED, FAILED) mean there was none."""


@dataclass(slots=True)
class ActionResult:
    """The outcome of ``s`` / ``p`` / ``r``: ``code`` is OK, ERROR, UNAUTHORISED_ACCESS
    (for ``s``: the AdminResponse's), REFUSED (the member said no) or FAILED (no answer)."""

    action: str
    ok: bool
    code: str
    message: str
    member_id: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


class ClusterSource(Protocol):
    """The console's data feed and its cluster actions."""

    @property
    def members(self) -> Sequence[MemberEndpoints]: ...

    async def describe(self, member_id: int) -> MemberStatus:
        """``describe`` of one member; :class:`SourceError` if it cannot be had."""
        ...

    async def errors(self, member_id: int, limit: int) -> list[dict[str, Any]]:
        """The member's recent warnings and errors; :class:`SourceError` on failure."""
        ...

    async def snapshot(self, member_id: int) -> ActionResult:
        """AdminRequest SNAPSHOT through the client library, in a session opened at
        ``member_id`` (the leader); never raises."""
        ...

    async def admin_action(self, member_id: int, command: str) -> ActionResult:
        """``suspend`` / ``resume`` on ``member_id``'s admin port; never raises."""
        ...

    async def aclose(self) -> None: ...


class LiveSource:
    """The real cluster (see the module docstring)."""

    def __init__(
        self,
        members: Sequence[MemberEndpoints],
        *,
        timeout: float = 1.0,
        credentials: bytes | None = None,
        certs_dir: str | None = None,
        snapshot_timeout: float = 10.0,
    ) -> None:
        self._members = list(members)
        self._by_id = {m.member_id: m for m in self._members}
        self._connections = {m.member_id: AdminConnection(m) for m in self._members}
        self.timeout = timeout
        self.credentials = credentials
        self.certs_dir = certs_dir
        self.snapshot_timeout = snapshot_timeout

    @property
    def members(self) -> Sequence[MemberEndpoints]:
        return self._members

    async def _request(self, member_id: int, command: str, args: dict[str, str]) -> AdminReply:
        connection = self._connections[member_id]
        try:
            reply = await connection.request(command, args, timeout=self.timeout)
        except AdminUnreachable as exc:
            raise SourceError(str(exc)) from None
        if not reply.ok:
            raise SourceError(reply.message or f"{command} refused")
        return reply

    async def _query(self, member_id: int, command: str, args: dict[str, str]) -> Any:
        reply = await self._request(member_id, command, args)
        try:
            return reply_body(reply)
        except Exception as exc:  # a ProtocolError on bad JSON
            raise SourceError(str(exc)) from None

    async def describe(self, member_id: int) -> MemberStatus:
        reply = await self._request(member_id, "describe", {})
        try:
            return decode_status(reply.body)
        except ProtocolError as exc:  # not a MemberStatus
            raise SourceError(str(exc)) from None

    async def errors(self, member_id: int, limit: int) -> list[dict[str, Any]]:
        body = await self._query(member_id, "errors", {"limit": str(limit)})
        return [r for r in body if isinstance(r, dict)] if isinstance(body, list) else []

    async def snapshot(self, member_id: int) -> ActionResult:
        member = self._by_id.get(member_id)
        if member is None:
            return ActionResult("snapshot", False, "FAILED", f"no member {member_id}")
        endpoints = format_ingress_endpoints([member])
        started = time.monotonic()
        try:
            async with client.connect(
                endpoints,
                credentials=self.credentials,
                connect_timeout=self.timeout * 3,
                certs_dir=self.certs_dir,
            ) as c:
                response = await c.request_snapshot(timeout=self.snapshot_timeout)
                leader = c.leader_member_id
        except client.SessionRejectedError as exc:
            return ActionResult("snapshot", False, "REFUSED", f"session rejected: {exc}")
        except client.AuthenticationRejectedError as exc:
            return ActionResult("snapshot", False, "REFUSED", f"authentication rejected: {exc}")
        except client.ConnectTimeoutError as exc:
            return ActionResult(
                "snapshot", False, "FAILED", f"no session: {exc}", member_id=member_id
            )
        except TimeoutError:
            return ActionResult(
                "snapshot",
                False,
                "FAILED",
                f"no AdminResponse within {self.snapshot_timeout:g}s",
            )
        except Exception as exc:  # SessionClosedError, network errors, ...
            return ActionResult("snapshot", False, "FAILED", f"{type(exc).__name__}: {exc}")
        code = response.response_code.name
        elapsed = time.monotonic() - started
        message = response.message or ("snapshot taken" if code == "OK" else code)
        return ActionResult(
            "snapshot",
            code == "OK",
            code,
            message,
            member_id=leader,
            details={"elapsed_s": round(elapsed, 3), "redirected": leader != member_id},
        )

    async def admin_action(self, member_id: int, command: str) -> ActionResult:
        member = self._by_id.get(member_id)
        if member is None:
            return ActionResult(command, False, "FAILED", f"no member {member_id}")
        try:
            reply = await admin_request(member, command, {}, timeout=self.timeout * 3)
        except AdminUnreachable as exc:
            return ActionResult(command, False, "FAILED", f"unreachable ({exc})", member_id)
        code = "OK" if reply.ok else "REFUSED"
        return ActionResult(command, reply.ok, code, reply.message or code, member_id)

    async def aclose(self) -> None:
        for connection in self._connections.values():
            await connection.aclose()
