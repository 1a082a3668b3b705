"""An anyio client of a member's admin port, for asyncio callers (the operator console).

``cluster-tool`` (:mod:`cluster.tool`) speaks the same protocol on Trio.  This module
reuses the protocol module (:mod:`cluster.protocol.admin`, the ``ADMIN`` codec and the
framing) and adds only the anyio socket shell, so it runs under asyncio (Textual) and
Trio alike:

- :func:`request` sends one :class:`~cluster.protocol.admin.AdminCommand` on a fresh
  connection and returns the :class:`~cluster.protocol.admin.AdminReply`;
- :class:`AdminConnection` keeps one connection to a member open for repeated queries
  (``describe`` every few hundred milliseconds) and reconnects after any failure.

Every failure to get a reply (refused, timed out, closed, bad bytes) is raised as
:class:`AdminUnreachable` with a short reason; a reply with ``ok=False`` is returned, not
raised.
"""

from __future__ import annotations

import itertools
import os
import ssl
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from .config import MemberEndpoints
from .protocol.admin import AdminCommand, AdminReply, decode_body
from .protocol.codec import ADMIN
from .protocol.errors import ProtocolError
from .protocol.framing import FrameDecoder, encode_frame
from .transport.tls import (
    NOT_TLS,
    REFUSED,
    handshake_failure,
    load_client_identity,
    refused_words,
    reset_by_peer,
    sent_alert,
    speaks_tls,
    tls_required,
    why_hello_closed,
)

__all__ = ["MAX_REPLY_SIZE", "AdminConnection", "AdminUnreachable", "request"]

MAX_REPLY_SIZE = 64 << 20
_RECEIVE_SIZE = 256 * 1024
_correlation_ids = itertools.count(1)

_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
_FAILURES: tuple[type[BaseException], ...] = (*_NETWORK_ERRORS, ProtocolError, ssl.SSLError)
_tls: ssl.SSLContext | None = None


def use_certs(folder: str | os.PathLike[str] | None, *, user: str = "cluster-tui") -> None:
    """Talk to admin ports over mutual TLS with the ``client-<NAME>`` folder ``folder``
    (``cluster-tool`` and ``cluster-tui`` take it as ``--certs-dir``); None: plaintext.
    :class:`~cluster.transport.tls.TlsError` when ``folder`` will not do (``user``, who
    needs it, is named when it is a member's folder)."""
    global _tls
    _tls = (
        None
        if folder is None
        else load_client_identity(Path(folder), user=user, preferred="admin").client_context
    )


async def _connect(member: MemberEndpoints) -> anyio.abc.ByteStream:
    """A connection to ``member``'s admin port, after the TLS handshake with
    certificates (:class:`AdminUnreachable` with its reason when that fails)."""
    try:
        stream = await anyio.connect_tcp(member.host, member.admin_port)
    except OSError as exc:
        if reset_by_peer(exc):  # accepted and reset at once: at its connection cap
            who = f"member {member.member_id}"
            raise AdminUnreachable(refused_words(who, tls=_tls is not None)) from None
        raise
    if _tls is None:
        return stream
    try:
        return await TLSStream.wrap(
            stream,
            server_side=False,
            hostname=member.host,
            ssl_context=_tls,
            standard_compatible=False,
        )
    except _FAILURES as exc:
        await _aclose_quietly(stream)
        verdict = await why_hello_closed(exc, member.host, member.admin_port)
        if verdict == REFUSED:
            raise AdminUnreachable(refused_words(f"member {member.member_id}")) from None
        if verdict == NOT_TLS:
            raise AdminUnreachable(
                f"member {member.member_id} does not speak TLS (it closed the connection at "
                "our TLS hello): leave out --certs-dir, or start it with --certs-dir"
            ) from None
        raise AdminUnreachable(
            f"TLS handshake with member {member.member_id} failed: {handshake_failure(exc)}"
        ) from None
    except BaseException:
        await _aclose_quietly(stream)
        raise


async def _aclose_quietly(stream: anyio.abc.ByteStream) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except _NETWORK_ERRORS:
            pass


async def _why_closed(member: MemberEndpoints, exc: BaseException) -> str:
    """Why ``member`` closed (or reset) the connection before a reply: without
    certificates, because it requires TLS (it answers a TLS hello); with them, perhaps
    because it refused ours; else what the socket said."""
    if _tls is None:
        if await speaks_tls(member.host, member.admin_port):
            return tls_required([member.member_id])
        return _reason(exc)
    if reset_by_peer(exc):  # evicted at its cap before its handshake ended
        return refused_words(f"member {member.member_id}")
    alert = sent_alert(exc)
    sent = f" (it sent the alert {alert!r})" if alert else ""
    return (
        f"member {member.member_id} closed the TLS connection without a reply{sent} "
        "(a member refuses a certificate that way: is --certs-dir a client-NAME folder of "
        "this cluster's `cluster-tool certs`?)"
    )


_CLOSED: tuple[type[BaseException], ...] = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    ConnectionError,
    ssl.SSLError,
)
"""What a connection that the member closed or reset before its reply raises."""


class AdminUnreachable(Exception):
    """The member did not answer (refused, timed out, closed, bad bytes), or we cannot
    talk to it: it requires TLS, or the TLS handshake failed (the reason says so:
    :func:`~cluster.transport.tls.is_tls_problem`)."""


def reply_body(reply: AdminReply) -> Any:
    """The decoded JSON body of ``reply`` (``None`` when empty)."""
    return decode_body(reply.body)


async def _exchange(
    stream: anyio.abc.ByteStream, decoder: FrameDecoder, command: AdminCommand
) -> AdminReply:
    await stream.send(encode_frame(command))
    while True:
        data = await stream.receive(_RECEIVE_SIZE)
        for body in decoder.feed(data):
            reply = ADMIN.decode(body)
            if isinstance(reply, AdminReply) and reply.correlation_id in (
                command.correlation_id,
                -1,
            ):
                return reply


def _reason(exc: BaseException) -> str:
    if isinstance(exc, anyio.EndOfStream):
        return "connection closed before a reply"
    if isinstance(exc, ProtocolError):
        return f"bad reply: {exc}"
    if isinstance(exc, OSError):
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        # anyio's "All connection attempts failed" hides the errno in __cause__
        if isinstance(cause.errno, int) and cause.errno > 0:
            return os.strerror(cause.errno).lower()
        if cause.strerror:
            return cause.strerror
    return str(exc) or type(exc).__name__


async def request(
    member: MemberEndpoints,
    command: str,
    args: dict[str, str] | None = None,
    *,
    timeout: float = 2.0,  # noqa: ASYNC109
) -> AdminReply:
    """Send one command to ``member``'s admin port on a new connection; return the reply."""
    message = AdminCommand(next(_correlation_ids), command, dict(args or {}))
    try:
        with anyio.fail_after(timeout):
            stream = await _connect(member)
            try:
                return await _exchange(stream, FrameDecoder(MAX_REPLY_SIZE), message)
            except _CLOSED as exc:
                closed: BaseException = exc
            finally:
                await _aclose_quietly(stream)
            raise AdminUnreachable(await _why_closed(member, closed))
    except TimeoutError:
        raise AdminUnreachable(f"no reply within {timeout:g}s") from None
    except _FAILURES as exc:
        raise AdminUnreachable(_reason(exc)) from None


class AdminConnection:
    """One member's admin port, kept open across requests (one request at a time).

    Any failure closes the connection; the next :meth:`request` dials again.  A request
    cancelled from outside also drops the connection, since its reply may still come.
    """

    def __init__(self, member: MemberEndpoints) -> None:
        self.member = member
        self._stream: anyio.abc.ByteStream | None = None
        self._decoder = FrameDecoder(MAX_REPLY_SIZE)
        self._lock = anyio.Lock()

    @property
    def connected(self) -> bool:
        return self._stream is not None

    async def request(
        self,
        command: str,
        args: dict[str, str] | None = None,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109
    ) -> AdminReply:
        """Send ``command`` and return the reply; :class:`AdminUnreachable` on failure."""
        message = AdminCommand(next(_correlation_ids), command, dict(args or {}))
        async with self._lock:
            done = False
            try:
                with anyio.fail_after(timeout):
                    if self._stream is None:
                        self._stream = await _connect(self.member)
                        self._decoder = FrameDecoder(MAX_REPLY_SIZE)
                    try:
                        reply = await _exchange(self._stream, self._decoder, message)
                    except _CLOSED as exc:
                        await self.aclose()
                        raise AdminUnreachable(await _why_closed(self.member, exc)) from None
                done = reply.correlation_id != -1
                return reply
            except TimeoutError:
                raise AdminUnreachable(f"no reply within {timeout:g}s") from None
            except _FAILURES as exc:
                raise AdminUnreachable(_reason(exc)) from None
            finally:
                if not done:
                    await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (if open); never raises."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except _NETWORK_ERRORS:
                    pass
