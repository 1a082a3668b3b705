"""Dialling one member: a TCP connect (and, with certificates, a TLS handshake with a
member's certificate on the other end), and what went wrong, in words for the errors
the client raises (``"0=127.0.0.1:9010 refused, ..."``)."""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSAttribute, TLSStream

from cluster.transport.tls import (
    NOT_TLS,
    REFUSED,
    closed_in_handshake,
    handshake_failure,
    refused_reason,
    reset_by_peer,
    why_hello_closed,
)

from ._endpoints import Endpoint

__all__ = [
    "CLOSED_WORDS",
    "CONNECT_ATTEMPT_TIMEOUT",
    "NETWORK_ERRORS",
    "TLS_REQUIRED_WORDS",
    "aclose_quietly",
    "describe_failures",
    "peer_role",
    "try_connect",
]

CONNECT_ATTEMPT_TIMEOUT = 1.0  # one TCP connect attempt
SOCKET_OPTIONS = (
    (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
    (socket.IPPROTO_TCP, "TCP_KEEPIDLE", 5),
    (socket.IPPROTO_TCP, "TCP_KEEPINTVL", 2),
    (socket.IPPROTO_TCP, "TCP_KEEPCNT", 3),
    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", 15_000),
)
"""As a member's sockets (``cluster.transport.tcp``): a connection across a partition is
found dead by keepalive when idle, and by ``TCP_USER_TIMEOUT`` when what the client sent
stays unacknowledged for 15 s (a blocked send fails then, not after the kernel's ~15
minutes of retries).  The liveness loop (``_ingress.py``) gives a silent connection that
carries the session's egress up sooner, after 3 s."""


def tune_socket(stream: anyio.abc.SocketStream) -> None:
    """Set :data:`SOCKET_OPTIONS` where the platform has them."""
    with suppress(OSError, anyio.TypedAttributeLookupError):
        sock = stream.extra(SocketAttribute.raw_socket)
        for level, name, value in SOCKET_OPTIONS:
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(level, option, value)


NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


async def aclose_quietly(resource: anyio.abc.AsyncResource) -> None:
    """Close ``resource`` even while cancelled, ignoring network errors."""
    with anyio.CancelScope(shield=True):
        with suppress(*NETWORK_ERRORS):
            await resource.aclose()


async def try_connect(
    endpoint: Endpoint, tls: ssl.SSLContext | None = None
) -> anyio.abc.SocketStream | str:
    """One TCP connect attempt (with ``tls``: and a TLS handshake, with a member's
    certificate on the other end): the stream, or what went wrong, in words."""
    try:
        with anyio.fail_after(CONNECT_ATTEMPT_TIMEOUT):
            raw = await anyio.connect_tcp(endpoint.host, endpoint.port)
            tune_socket(raw)
            if tls is None:
                return raw
            try:
                stream = await TLSStream.wrap(
                    raw,
                    server_side=False,
                    hostname=endpoint.host,
                    ssl_context=tls,
                    standard_compatible=False,
                )
            except BaseException:
                await aclose_quietly(raw)
                raise
    except TimeoutError:
        return "timed out"
    except ConnectionRefusedError:
        return "refused"
    except (ssl.SSLError, anyio.EndOfStream) as exc:
        return await _tls_failure(endpoint, exc)
    except (OSError, anyio.BrokenResourceError) as exc:
        if tls is None and reset_by_peer(exc):  # accepted and reset: at its cap
            return refused_reason(tls=False)
        if tls is not None and closed_in_handshake(exc):
            return await _tls_failure(endpoint, exc)
        return _describe_error(exc)
    if peer_role(stream) != "member":
        await aclose_quietly(stream)
        return "not a cluster member (its certificate is no member's)"
    return stream  # type: ignore[return-value]


async def _tls_failure(endpoint: Endpoint, exc: BaseException) -> str:
    """Our TLS handshake with ``endpoint`` failed: why (a member that closed the
    connection in order at our hello and takes a hello for something else speaks no
    TLS; one that reset it refuses connections: at its cap, under a flood)."""
    verdict = await why_hello_closed(exc, endpoint.host, endpoint.port)
    if verdict == REFUSED:
        return refused_reason()
    if verdict == NOT_TLS:
        return (
            "does not speak TLS (it closed the connection at our TLS hello): leave out "
            "certs_dir, or start the members with --certs-dir"
        )
    return f"TLS handshake failed: {handshake_failure(exc)}"


TLS_REQUIRED_WORDS = "requires TLS: pass certs_dir (a client-NAME folder)"
"""What a member did that closed our plaintext request and answers a TLS hello."""
CLOSED_WORDS = "closed the connection without answering"
"""What a member did that accepted our connection and closed it without a word."""


_ERRNO_WORDS = {
    errno.ECONNREFUSED: "refused",
    errno.ETIMEDOUT: "timed out",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
}


def _describe_error(exc: BaseException) -> str:
    inner = exc.__cause__ or exc.__context__
    if isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[-1]
    if isinstance(inner, OSError):
        return _describe_error(inner)
    if isinstance(exc, OSError) and exc.errno in _ERRNO_WORDS:
        return _ERRNO_WORDS[exc.errno]
    text = str(exc).lower()
    for words in ("refused", "timed out", "unreachable", "name or service not known"):
        if words in text:
            return "refused" if words == "refused" else words
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return text or type(exc).__name__


def describe_failures(failures: Mapping[Endpoint, str], members: Mapping[int, Endpoint]) -> str:
    """``"0=127.0.0.1:9010 refused, ..."``: what each member did on its last dial."""
    ids = {endpoint: member_id for member_id, endpoint in members.items()}
    words = [
        f"{ids[endpoint]}={endpoint} {what}" if endpoint in ids else f"{endpoint} {what}"
        for endpoint, what in failures.items()
    ]
    return ", ".join(words) or "none was dialled"


def peer_role(stream: anyio.abc.AnyByteStream) -> str | None:
    """The OU of the peer's certificate on a TLS stream (None without one)."""
    try:
        cert = stream.extra(TLSAttribute.peer_certificate)
    except anyio.TypedAttributeLookupError:
        return None
    subject: Any = (cert or {}).get("subject", ())
    for rdn in subject:
        for key, value in rdn:
            if key == "organizationalUnitName":
                return str(value)
    return None
