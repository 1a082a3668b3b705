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

from .config import MemberEndpoints
from .protocol.admin import AdminCommand, AdminReply, decode_body
from .protocol.codec import ADMIN
from .protocol.errors import ProtocolError
from .protocol.framing import FrameDecoder, encode_frame
from .transport.tls import load_identity

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


def use_certs(folder: str | os.PathLike[str] | None) -> None:
    """Talk to admin ports over mutual TLS with the ``client-<NAME>`` folder ``folder``
    (``cluster-tool`` and ``cluster-tui`` take it as ``--certs-dir``); None: plaintext."""
    global _tls
    _tls = None if folder is None else load_identity(Path(folder)).client_context


async def _connect(member: MemberEndpoints) -> anyio.abc.ByteStream:
    if _tls is None:
        return await anyio.connect_tcp(member.host, member.admin_port)
    return await anyio.connect_tcp(
        member.host, member.admin_port, ssl_context=_tls, tls_standard_compatible=False
    )


class AdminUnreachable(Exception):
    """The member did not answer (refused, timed out, closed, bad bytes)."""


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
            async with stream:
                return await _exchange(stream, FrameDecoder(MAX_REPLY_SIZE), message)
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
                    reply = await _exchange(self._stream, self._decoder, message)
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
