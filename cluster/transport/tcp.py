"""Framed TCP on Trio: the real network."""

from __future__ import annotations

import errno
import gc
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable

import trio

from .base import StreamHandler, listen_error
from .gate import ConnectionGate, reset_on_close, stream_address
from .tls import TlsIdentity

log = logging.getLogger("cluster.transport")

_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
"""A connection whose peer's host is gone (no FIN, no RST: a power cut, a partition) is
found dead after about ``5 + 2 * 3`` seconds of silence, instead of the kernel's two hours:
a member link is only given to a reconnecting member once its old one is closed."""

USER_TIMEOUT_MS = 15_000
"""``TCP_USER_TIMEOUT``: a connection whose sent data stays unacknowledged this long (the
peer's host gone, a partition) is closed by the kernel, and a blocked send fails then,
instead of after the kernel's retransmission limit (``tcp_retries2``: about 15 minutes).
Keepalive covers only an idle connection; this covers one with data in flight.  Generous
on purpose: a live peer acknowledges within milliseconds, even while its application is
busy; a peer that reads nothing for this long (a full receive window all that time) is
cut too.  Member links notice silence far sooner by themselves
(:mod:`cluster.agents.silence`); this is the floor for every other connection."""


def _tune(stream: trio.SocketStream) -> None:
    try:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, True)
        for option, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
            ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
        ):
            if hasattr(socket, option):
                stream.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError:  # pragma: no cover - not every socket supports it
        pass


_ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "the other end does not trust our certificate's CA",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the other end refused our certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the other end refused our certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the other end says our certificate has expired",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the other end wants a certificate",
    "WRONG_VERSION_NUMBER": "the other end does not speak TLS",
}
_ANOTHER_CA = frozenset({19, 20, 21})
"""OpenSSL's verify codes for a chain that does not end at our CA (self-signed in the
chain, unable to get the local issuer, unable to verify the first certificate)."""


def failure_reason(exc: BaseException) -> str:
    """A TLS failure in a few words: OpenSSL's reason (with what it means for the
    commonest), or what the socket said."""
    cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        hint = ": not signed by our CA" if cause.verify_code in _ANOTHER_CA else ""
        return f"certificate refused ({cause.verify_message}{hint})"
    if isinstance(cause, ssl.SSLEOFError) or cause is None:
        return "connection closed during the handshake"
    if isinstance(cause, ssl.SSLError) and cause.reason:
        meaning = _ALERTS.get(cause.reason)
        return f"{meaning} ({cause.reason})" if meaning else str(cause.reason)
    return str(cause) or type(cause).__name__


_CONNECT_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "timed out",
    errno.EADDRNOTAVAIL: "address not available",
}


def _connect_error(exc: OSError, host: str, port: int) -> OSError:
    """Trio's ``all attempts to connect to HOST:PORT failed`` as the reason it hides in
    its context (the attempts' errors), keeping the errno: ``[Errno 111] cannot connect
    to 127.0.0.1:9020: connection refused``."""
    if isinstance(exc, socket.gaierror):
        return OSError(exc.errno, f"cannot resolve {host!r} ({exc.strerror or exc})")
    attempts: list[BaseException] = [exc]
    group = exc.__context__ or exc.__cause__
    if isinstance(group, BaseExceptionGroup):
        attempts = list(group.exceptions)
    for code, reason in _CONNECT_REASONS.items():  # the most telling first
        if any(isinstance(a, OSError) and a.errno == code for a in attempts):
            return OSError(code, f"cannot connect to {host}:{port}: {reason}")
    last = attempts[-1]
    words = (last.strerror if isinstance(last, OSError) else None) or str(last)
    message = f"cannot connect to {host}:{port}: {words}"
    number: int | None = exc.errno if exc.errno is not None else getattr(last, "errno", None)
    return OSError(number, message) if number is not None else OSError(message)


COLLECT_AFTER = 64
"""Failed handshakes in one report (a second) after which the garbage is collected."""


class TcpNetwork:
    """:class:`~cluster.transport.base.Network` over real TCP sockets.

    With ``tls`` (:func:`~cluster.transport.tls.load_identity`) every stream is mutual
    TLS: :meth:`open_stream` returns a ``trio.SSLStream`` whose handshake is done, and
    :meth:`serve` hands its handler only streams whose handshake finished within
    ``handshake_timeout``; the others are closed and counted in ``tls_failures`` (and
    summarised in at most one INFO line a second).  A handler made with
    :func:`~cluster.transport.gate.gated` has its connections counted at accept, before
    the handshake (:class:`~cluster.transport.gate.ConnectionGate`).
    """

    def __init__(
        self,
        connect_timeout: float = 2.0,
        *,
        tls: TlsIdentity | None = None,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.handshake_timeout = handshake_timeout
        self.tls_failures = 0
        self.accept_pauses = 0
        self._unreported = 0
        self._last_failure = ""
        self._reported_at = float("-inf")
        self._report_pending = False

    async def open_stream(self, host: str, port: int) -> trio.abc.Stream:
        """Connect (and with ``tls`` shake hands) within ``connect_timeout``; ``OSError``
        if that fails or takes longer."""
        what = "connecting to"
        with trio.move_on_after(self.connect_timeout):
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                raise _connect_error(exc, host, port) from None
            _tune(stream)
            if self.tls is None:
                return stream
            what = "in the TLS handshake with"
            return await self._client_handshake(stream, self.tls, host, port)
        raise OSError(f"timed out {what} {host}:{port}")

    async def _client_handshake(
        self, stream: trio.SocketStream, tls: TlsIdentity, host: str, port: int
    ) -> trio.SSLStream[trio.SocketStream]:
        tls_stream = trio.SSLStream(
            stream, tls.client_context, server_side=False, https_compatible=False
        )
        try:
            try:
                await tls_stream.do_handshake()
            except (trio.BrokenResourceError, OSError) as exc:
                raise OSError(
                    f"TLS handshake with {host}:{port} failed: {failure_reason(exc)}"
                ) from None
        except BaseException:  # the error above, or the timeout's cancellation
            await trio.aclose_forcefully(stream)
            raise
        return tls_stream

    async def serve(
        self,
        host: str,
        port: int,
        handler: StreamHandler,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:  # one line naming the port, not a traceback
            raise listen_error(host, port, exc) from exc
        bound = listeners[0].socket.getsockname()[1]
        gate: ConnectionGate | None = getattr(handler, "gate", None)
        inner: StreamHandler = getattr(handler, "inner", handler) if gate else handler
        tls = self.tls

        async def handle(stream: trio.SocketStream) -> None:
            # with a gate, its slot was taken at accept (_accept_loop) and is given back
            # here, however the connection ends (a TLS handshake that fails included)
            tls_stream: trio.SSLStream[trio.SocketStream] | None = None
            guard = gate.guard(stream) if gate is not None else trio.CancelScope()
            try:
                with guard:  # a gate that evicts its oldest connection cancels it
                    _tune(stream)
                    if tls is None:
                        await inner(stream)
                        return
                    tls_stream = await self._server_handshake(stream, tls, nursery)
                    if tls_stream is not None:
                        if gate is not None:
                            gate.move(stream, tls_stream)
                        await inner(tls_stream)
            finally:
                if gate is not None:
                    gate.release(stream)
                    if tls_stream is not None:
                        gate.release(tls_stream)
                if guard.cancelled_caught:  # evicted: the handler had no say
                    await trio.aclose_forcefully(tls_stream or stream)

        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, handle, nursery, bound, gate)
            task_status.started(bound)

    async def _accept_loop(
        self,
        listener: trio.SocketListener,
        handle: Callable[[trio.SocketStream], Awaitable[None]],
        nursery: trio.Nursery,
        port: int,
        gate: ConnectionGate | None = None,
    ) -> None:
        """Accept for ever.  Out of file descriptors (or buffers) is an event, not an
        error: one WARNING, then accepts pause (doubling to 1 s) until one succeeds;
        the connections already open carry on.  With a ``gate``, each connection is
        counted here, before any byte is read or a handshake begins; one over the cap or
        its address's share, when it could not make room, is reset at once (no task, no
        handshake)."""
        pause = 0.0
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _RESOURCE_ERRNOS:
                        raise
                    self.accept_pauses += 1
                    if pause == 0.0:
                        log.warning(
                            "port %d: cannot accept connections (%s); pausing accepts "
                            "until resources free up",
                            port,
                            os.strerror(exc.errno or 0),
                        )
                    pause = min(max(2 * pause, 0.01), 1.0)
                    await trio.sleep(pause)
                    continue
                if pause:
                    log.warning("port %d: accepting connections again", port)
                    pause = 0.0
                if gate is not None and not gate.hold(stream, stream_address(stream)):
                    reset_on_close(stream)  # an RST: "refused", not "does not speak TLS"
                    stream.socket.close()
                    continue
                nursery.start_soon(handle, stream)

    async def _server_handshake(
        self, stream: trio.SocketStream, tls: TlsIdentity, nursery: trio.Nursery
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """``stream`` wrapped and shaken hands with, or ``None`` once it is closed and
        counted (no certificate, a wrong one, not TLS at all, too slow)."""
        tls_stream = trio.SSLStream(
            stream, tls.server_context, server_side=True, https_compatible=False
        )
        reason = f"no handshake within {self.handshake_timeout:g}s"
        try:
            with trio.move_on_after(self.handshake_timeout):
                try:
                    await tls_stream.do_handshake()
                    return tls_stream
                except (trio.BrokenResourceError, OSError) as exc:
                    reason = failure_reason(exc)
        except BaseException:  # cancelled in the middle of it (the node stops)
            await trio.aclose_forcefully(stream)
            raise
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        self._tls_failed(f"{peer}: {reason}", nursery)
        await trio.aclose_forcefully(stream)
        return None

    def _tls_failed(self, what: str, nursery: trio.Nursery) -> None:
        self.tls_failures += 1
        self._unreported += 1
        self._last_failure = what
        if self._report_pending:
            return
        wait = self._reported_at + 1.0 - trio.current_time()
        if wait <= 0:
            self._report_failures()
        else:
            self._report_pending = True
            nursery.start_soon(self._report_later, wait)

    async def _report_later(self, wait: float) -> None:
        try:
            await trio.sleep(wait)
        finally:
            self._report_pending = False
        self._report_failures()

    def _report_failures(self) -> None:
        self._reported_at = trio.current_time()
        count, self._unreported = self._unreported, 0
        if count >= COLLECT_AFTER:
            # a failed handshake leaves its SSLStream and OpenSSL's buffers (about 50 KB)
            # in reference cycles (the exceptions' frames) that only a full collection
            # frees, which a quiet node may not run for minutes: 768 failed handshakes
            # kept 38 MB.  At most once a second, after a burst.
            gc.collect()
        if count == 1:
            log.info("TLS handshake failed: %s", self._last_failure)
        else:
            log.info(
                "TLS handshake failed on %d connections (%d in all); the last: %s",
                count,
                self.tls_failures,
                self._last_failure,
            )
