"""How ``cluster-tool`` talks to members: one admin command to one member, or to every
member at once, each answer or failure a :class:`Result`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ..config import MemberEndpoints
from ..protocol.admin import AdminCommand, AdminReply, MemberStatus, decode_body, decode_status
from ..protocol.codec import ADMIN
from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder, encode_frame
from ..transport.tls import (
    NOT_TLS,
    REFUSED,
    TlsIdentity,
    handshake_failure,
    load_client_identity,
    refused_words,
    reset_by_peer,
    sent_alert,
    speaks_tls,
    tls_required,
    why_hello_closed,
)

MAX_REPLY_SIZE = 64 << 20

_correlation_ids = itertools.count(1)


class Unreachable(Exception):
    """The member did not answer (refused, timed out, closed, bad bytes), or we cannot
    talk to it: it requires TLS, or the TLS handshake failed (the reason names TLS:
    :func:`~cluster.transport.tls.is_tls_problem`)."""


@dataclass
class Result:
    member: MemberEndpoints
    reply: AdminReply | None = None
    error: str = ""
    status: MemberStatus | None = None
    """A ``describe`` answer, decoded (see :meth:`decode_describe`)."""

    @property
    def reachable(self) -> bool:
        return self.reply is not None

    @property
    def ok(self) -> bool:
        """It answered, and accepted the command."""
        return self.reply is not None and self.reply.ok and not self.error

    @property
    def failure(self) -> str:
        """Why there is no answer: the network error, the refusal, or a bad describe body."""
        return self.error or (self.reply.message if self.reply is not None else "")

    def decode_describe(self) -> None:
        """Decode an accepted ``describe`` answer into ``status``; a body that is not a
        :class:`MemberStatus` leaves ``status`` unset and becomes this member's ``error``."""
        if self.reply is None or not self.reply.ok:
            return
        try:
            self.status = decode_status(self.reply.body)
        except ProtocolError as exc:
            self.error = str(exc)

    @property
    def body(self) -> Any:
        return decode_body(self.reply.body) if self.reply is not None else None


_identity: TlsIdentity | None = None
"""Our client certificate with ``--certs-dir`` (mutual TLS with the admin ports)."""


def use_certs(folder: str | None) -> None:
    """Talk TLS with the client identity in ``folder`` (a ``client-<NAME>`` folder), or
    plain TCP with None; :class:`~cluster.transport.tls.TlsError` if ``folder`` will not
    do (a member's folder, an expired certificate, a missing file)."""
    global _identity
    _identity = (
        None
        if folder is None
        else load_client_identity(Path(folder), user="cluster-tool", preferred="admin")
    )


def _reset_words(member: MemberEndpoints) -> str:
    return refused_words(f"member {member.member_id}", tls=_identity is not None)


class _Closed(Exception):
    """The member closed (or reset) the connection before it replied."""


async def _open(member: MemberEndpoints) -> trio.abc.Stream:
    """A connection to ``member``'s admin port (with ``--certs-dir``: after the TLS
    handshake); :class:`Unreachable` naming the handshake's reason when that fails."""
    try:
        stream = await trio.open_tcp_stream(member.host, member.admin_port)
    except OSError as exc:
        if reset_by_peer(exc):  # accepted and reset at once: at its connection cap
            raise Unreachable(_reset_words(member)) from None
        raise
    if _identity is None:
        return stream
    tls = trio.SSLStream(stream, _identity.client_context, server_side=False,
                         https_compatible=False)  # fmt: skip
    try:
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, OSError) as exc:
            verdict = await why_hello_closed(exc, member.host, member.admin_port)
            if verdict == REFUSED:
                raise Unreachable(_reset_words(member)) from None
            if verdict == NOT_TLS:
                raise Unreachable(
                    f"member {member.member_id} does not speak TLS (it closed the connection "
                    "at our TLS hello): leave out --certs-dir, or start it with --certs-dir"
                ) from None
            raise Unreachable(
                f"TLS handshake with member {member.member_id} failed: {handshake_failure(exc)}"
            ) from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls


async def _exchange(stream: trio.abc.Stream, command: AdminCommand) -> AdminReply:
    try:
        await stream.send_all(encode_frame(command))
        decoder = FrameDecoder(MAX_REPLY_SIZE)
        while True:
            data = await stream.receive_some(256 * 1024)
            if not data:
                raise _Closed("connection closed before a reply")
            for body in decoder.feed(data):
                reply = ADMIN.decode(body)
                if isinstance(reply, AdminReply) and reply.correlation_id in (
                    command.correlation_id,
                    -1,
                ):
                    return reply
    except (trio.BrokenResourceError, ConnectionError) as exc:
        raise _Closed(str(exc) or "connection broken before a reply") from exc


async def _why_closed(member: MemberEndpoints, closed: _Closed) -> str:
    """Why ``member`` closed the connection without a reply: it wants TLS (a plaintext
    request, and the port answers a TLS hello), it refused our certificate (TLS), or
    what the socket said."""
    if _identity is None:
        if await speaks_tls(member.host, member.admin_port):
            return tls_required([member.member_id])
        return str(closed)
    if reset_by_peer(closed.__cause__):  # evicted at its cap before its handshake ended
        return _reset_words(member)
    alert = sent_alert(closed.__cause__)
    sent = f" (it sent the alert {alert!r})" if alert else ""
    return (
        f"member {member.member_id} closed the TLS connection without a reply{sent} "
        "(a member refuses a certificate that way: is --certs-dir a client-NAME folder of "
        "this cluster's `cluster-tool certs`?)"
    )


async def request(
    member: MemberEndpoints, command: str, args: dict[str, str], limit: float
) -> AdminReply:
    """Send one command to ``member``'s admin port and wait for its reply."""
    message = AdminCommand(next(_correlation_ids), command, args)
    try:
        with trio.fail_after(limit):
            stream = await _open(member)
            try:
                async with stream:
                    return await _exchange(stream, message)
            except _Closed as closed:
                raise Unreachable(await _why_closed(member, closed)) from None
    except trio.TooSlowError:
        raise Unreachable(f"no reply within {limit:g}s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise Unreachable(str(exc) or type(exc).__name__) from None
    except ProtocolError as exc:
        raise Unreachable(f"bad reply: {exc}") from None


async def request_all(
    members: Sequence[MemberEndpoints], command: str, args: dict[str, str], limit: float
) -> list[Result]:
    """``command`` to every member at once; unreachable members are results with an error."""
    results = [Result(m) for m in members]

    async def one(result: Result) -> None:
        try:
            result.reply = await request(result.member, command, args, limit)
        except Unreachable as exc:
            result.error = str(exc)

    async with trio.open_nursery() as nursery:
        for result in results:
            nursery.start_soon(one, result)
    return results


async def describe_all(members: Sequence[MemberEndpoints], limit: float) -> list[Result]:
    """``describe`` every member, each answer decoded (:meth:`Result.decode_describe`)."""
    results = await request_all(members, "describe", {}, limit)
    for r in results:
        r.decode_describe()
    return results


def find_leader(described: Sequence[Result]) -> int:
    """The leader's member id from ``describe`` results (-1 if there is none)."""
    leaders = [r.status for r in described if r.status is not None and r.status.role == "LEADER"]
    if leaders:
        return max(leaders, key=lambda s: s.leadership_term_id).member_id
    return -1
