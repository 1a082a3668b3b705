"""Mutual TLS for :class:`~cluster.transport.tcp.TcpNetwork`.

An identity is one folder made by ``cluster-tool certs`` (:mod:`cluster.certs`):
``ca.crt``, ``tls.crt``, ``tls.key``.  Both sides present their certificate and accept
only certificates of that CA (``CERT_REQUIRED`` both ways).  Host names are not checked:
a peer is known by its certificate's name (:func:`peer_cert`: the CN, and the OU that
says ``member`` or ``client``), which the agents match against who the peer claims to be.

The clients of the members (the client library, ``cluster-tool``, ``cluster-tui``) load
their folder with :func:`load_client_identity` (a member's folder or an expired
certificate is refused there, with what to use instead) and say what went wrong when
TLS is the trouble: :func:`speaks_tls` (does a port that closed our plaintext request
answer a TLS hello?), :func:`why_hello_closed` (a handshake closed under us: a member at
its connection cap, which resets, or one without TLS, which closes in order?),
:func:`tls_required`, :func:`handshake_failure` and :func:`is_tls_problem`.  The node
never calls them.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import trio
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

CA_CERT = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
ROLES = ("member", "client")


class TlsError(Exception):
    """A TLS configuration problem: a missing, unreadable or invalid file (named)."""


@dataclass(frozen=True)
class TlsIdentity:
    """Who we are on the network: our certificate's name and role, and the contexts that
    present it (``server_context`` for what we accept, ``client_context`` for what we dial)."""

    folder: Path
    name: str
    role: str
    server_context: ssl.SSLContext
    client_context: ssl.SSLContext


@dataclass(frozen=True)
class PeerCert:
    """The verified certificate of the other end: its CN and OU."""

    name: str
    role: str


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{path}: no such file") from None
    except OSError as exc:
        raise TlsError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _certificate(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_read(path))
    except ValueError as exc:
        raise TlsError(f"{path}: not a PEM certificate ({exc})") from None


def _attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    value = values[0].value if values else ""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _context(server_side: bool, ca_path: Path, cert_path: Path, key_path: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(cert_path, key_path)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(
            f"{cert_path} with {key_path}: cannot load the certificate and key "
            f"({getattr(exc, 'reason', None) or exc})"
        ) from None
    try:
        context.load_verify_locations(cafile=str(ca_path))
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(f"{ca_path}: cannot load the CA certificate ({exc})") from None
    return context


def load_identity(folder: Path | str) -> TlsIdentity:
    """Load ``folder``'s ``ca.crt``, ``tls.crt`` and ``tls.key``; :class:`TlsError` naming
    the file if one is missing or unreadable, the key is not the certificate's, the
    certificate is not signed by ``ca.crt``, or its OU is neither ``member`` nor ``client``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TlsError(f"{folder}: not a certificate folder (no such directory)")
    ca_path, cert_path, key_path = folder / CA_CERT, folder / CERT_FILE, folder / KEY_FILE
    ca = _certificate(ca_path)
    cert = _certificate(cert_path)
    _read(key_path)  # a missing or unreadable key is named before the combined error
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise TlsError(f"{cert_path}: not issued by {ca_path} ({exc or 'bad signature'})") from None
    name = _attribute(cert, NameOID.COMMON_NAME)
    role = _attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME)
    if not name or role not in ROLES:
        raise TlsError(
            f"{cert_path}: subject {cert.subject.rfc4514_string()!r} needs a CN and an OU "
            f"of {' or '.join(ROLES)}"
        )
    return TlsIdentity(
        folder=folder,
        name=name,
        role=role,
        server_context=_context(True, ca_path, cert_path, key_path),
        client_context=_context(False, ca_path, cert_path, key_path),
    )


# ---------------------------------------------------------------------- client side
#
# What a client of the members (the client library, ``cluster-tool``, ``cluster-tui``) uses
# to load its folder and to say what went wrong when TLS is the trouble: the node itself
# never calls these.

TLS_REQUIRED = "requires TLS"
"""The words every "this member speaks TLS and we did not" message carries."""


def tls_required(member_ids: Sequence[int], option: str = "--certs-dir") -> str:
    """``"member 1 requires TLS: pass --certs-dir (a client-NAME folder)"`` (``"members 0,
    1 and 2 require TLS: ..."`` for several); ``option`` is how the caller passes one."""
    ids = [str(m) for m in sorted(member_ids)]
    if len(ids) == 1:
        who = f"member {ids[0]} {TLS_REQUIRED}"
    else:
        who = f"members {', '.join(ids[:-1])} and {ids[-1]} require TLS"
    return f"{who}: pass {option} (a client-NAME folder)"


_TLS_PROBLEM = re.compile(
    r"(TLS handshake with member \d+ failed"
    r"|members? [\d, and]+ (requires? TLS|does not speak TLS|closed the TLS connection))"
)


def is_tls_problem(reason: str | None) -> bool:
    """Whether a member's failure ``reason`` (as the tool and the console word it:
    :func:`tls_required`, "TLS handshake with member N failed: ...", "member N does not
    speak TLS ...", "member N closed the TLS connection ...") is a TLS mistake of ours
    (no certificates, the wrong ones), not a member that is down."""
    return reason is not None and _TLS_PROBLEM.match(reason) is not None


def _client_example(folder: Path, preferred: str) -> Path:
    """A client folder next to ``folder`` to suggest: ``client-<preferred>`` if it is
    there, else any ``client-*`` there, else ``client-<preferred>``."""
    parent = folder.parent
    wanted = parent / f"client-{preferred}"
    if wanted.is_dir():
        return wanted
    try:
        others = sorted(p for p in parent.glob("client-*") if p.is_dir())
    except OSError:
        others = []
    return others[0] if others else wanted


def _check_dates(path: Path, what: str, now: dt.datetime) -> None:
    cert = _certificate(path)
    if cert.not_valid_after_utc <= now:
        raise TlsError(
            f"{path}: {what} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            "make new certificates with `cluster-tool certs` (it keeps the folders that "
            "exist: remove this one first)"
        )
    if cert.not_valid_before_utc > now:
        raise TlsError(
            f"{path}: {what} is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (is this machine's clock right?)"
        )


def load_client_identity(
    folder: Path | str, *, user: str = "a client", preferred: str = "app"
) -> TlsIdentity:
    """:func:`load_identity` for a client of the members: also a :class:`TlsError` when
    ``folder`` holds a member's certificate (``user`` needs a ``client-NAME`` folder; one
    next to it is suggested, ``client-<preferred>`` first) or when its certificate or CA
    has expired (or is not valid yet), which the members would refuse without a word."""
    identity = load_identity(folder)
    where = identity.folder
    if identity.role != "client":
        example = _client_example(where, preferred)
        raise TlsError(
            f"{where} is {identity.name}'s folder (a {identity.role}'s certificate); "
            f"{user} needs a client-NAME folder, e.g. {example}"
        )
    now = dt.datetime.now(dt.UTC)
    _check_dates(where / CERT_FILE, f"the certificate of {identity.name!r}", now)
    _check_dates(where / CA_CERT, "the CA certificate", now)
    return identity


@functools.cache
def _client_hello() -> bytes:
    """The bytes of a TLS ClientHello (from a context that verifies nothing: it is only
    sent to see whether the other end answers in TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_side=False)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


_TLS_RECORDS = (0x15, 0x16)  # an alert, a handshake message
PROBE_TIMEOUT = 1.0


async def probe_hello(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> str:  # noqa: ASYNC109
    """What ``host:port`` does with a TLS ClientHello, within ``timeout`` (one
    connection, closed at once): ``"tls"`` (it answers with a TLS record: an alert or
    its ServerHello), ``"not-tls"`` (it answers with other bytes, or reads the hello and
    closes the connection in order: a member without TLS takes a hello for a bad
    frame), ``"refused"`` (the connection is refused or reset: a member at its
    connection cap resets new ones at accept, :mod:`cluster.transport.gate`) or
    ``"unknown"`` (nothing within ``timeout``, another error).  Runs under Trio and asyncio."""
    head = b""
    ended = False
    with anyio.move_on_after(timeout):
        try:
            stream = await anyio.connect_tcp(host, port)
        except OSError:
            return "refused"
        async with stream:
            try:
                await stream.send(_client_hello())
                while len(head) < 2:
                    head += await stream.receive(16 * 1024)
            except anyio.EndOfStream:
                ended = True
            except (OSError, anyio.BrokenResourceError) as exc:
                return "refused" if reset_by_peer(exc) else "unknown"
    if len(head) >= 2 and head[0] in _TLS_RECORDS and head[1] == 3:
        return "tls"
    if head or ended:
        return "not-tls"
    return "unknown"


async def speaks_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:  # noqa: ASYNC109
    """Whether ``host:port`` answers a TLS ClientHello with a TLS record (an alert or its
    ServerHello), within ``timeout`` (:func:`probe_hello`), so a client that was turned
    away in plaintext can say that the member wants TLS.  False when it cannot tell
    (refused, closed, silent, anything else)."""
    return await probe_hello(host, port, timeout) == "tls"


_RESETS = frozenset({errno.ECONNRESET, errno.EPIPE})


def reset_by_peer(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is the other end resetting the connection
    (ECONNRESET, EPIPE), at the connect (it may come before the connect is seen to
    finish) or after: what a member does to a connection it refuses at accept or evicts
    (:mod:`cluster.transport.gate`), where one without TLS closes our hello in order."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionResetError | BrokenPipeError):
            return True
        if isinstance(exc, OSError) and exc.errno in _RESETS:
            return True
        if isinstance(exc, BaseExceptionGroup):  # a connect's attempts (trio's)
            return any(reset_by_peer(e) for e in exc.exceptions)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


REFUSED = "refused"
""":func:`why_hello_closed`: the member reset the connection (at its connection cap)."""
NOT_TLS = "not-tls"
""":func:`why_hello_closed`: the member speaks no TLS."""


async def why_hello_closed(exc: BaseException, host: str, port: int) -> str | None:
    """Why our TLS handshake with ``host:port`` ended with the connection closed under
    it: :data:`REFUSED` when the member reset it, or resets a second hello too (it
    refuses new connections: at its connection cap, under a flood); :data:`NOT_TLS`
    when it closed it in order and takes a second hello for something else (a member
    without TLS); None when the handshake failed otherwise, or nothing tells
    (:func:`handshake_failure` then says what happened).  A refused connection is never
    taken for a member without TLS: a reset is not what one does."""
    if reset_by_peer(exc):
        return REFUSED
    if not closed_in_handshake(exc):
        return None
    answer = await probe_hello(host, port)
    if answer == "not-tls":
        return NOT_TLS
    if answer == "refused":
        return REFUSED
    return None


def refused_reason(tls: bool = True) -> str:
    """What a member that reset our connection before any answer did, in words (``tls``:
    we were to shake hands): the client's failure for a member."""
    when = "before the TLS handshake" if tls else "at once"
    return (
        f"reset the connection {when}: it refuses new connections (at its connection "
        "cap: overloaded, or under a flood of connections?)"
    )


def refused_words(who: str, tls: bool = True) -> str:
    """:func:`refused_reason` of ``who`` (``"member 1"``): what the tools say."""
    return f"{who} {refused_reason(tls)}"


_FOREIGN_CA = frozenset({2, 7, 18, 19, 20, 21})
"""OpenSSL's verify codes for "not signed by a CA we trust" (unable to get the issuer,
bad signature: a CA of the same name, self-signed, self-signed in the chain, local
issuer, cannot verify the leaf)."""


def _ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def sent_alert(exc: BaseException | None) -> str | None:
    """The TLS alert the other end sent, in words (``"unknown ca"``, ``"certificate
    expired"``), if ``exc`` (or what caused it) is OpenSSL reporting one."""
    error = _ssl_error(exc)
    if error is None or not error.reason or "ALERT_" not in error.reason:
        return None
    return error.reason.partition("ALERT_")[2].replace("_", " ").lower()


def closed_in_handshake(exc: BaseException) -> bool:
    """Whether the other end closed or reset the connection during our TLS handshake
    (as a member does on a hello it takes for a bad frame: it does not speak TLS)."""
    if isinstance(exc, anyio.EndOfStream | ConnectionResetError):
        return True
    cause = exc.__cause__ or exc.__context__
    return isinstance(_ssl_error(exc), ssl.SSLEOFError) or isinstance(
        cause, anyio.EndOfStream | ConnectionResetError
    )


_NOT_TLS = frozenset(
    {"WRONG_VERSION_NUMBER", "UNEXPECTED_MESSAGE", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}
)


def handshake_failure(exc: BaseException) -> str:
    """Why our TLS handshake with a member failed, in a few words, from the exception of
    ``trio.SSLStream.do_handshake`` or anyio's TLS wrap: OpenSSL's verify message (with
    a hint when the member's certificate is from another CA), the alert the member sent,
    or what the socket did."""
    error = _ssl_error(exc)
    if isinstance(error, ssl.SSLCertVerificationError):
        words = f"certificate verify failed: {error.verify_message}"
        if error.verify_code in _FOREIGN_CA:
            words += " (the member's certificate is not from our ca.crt: another cluster's?)"
        return words
    if closed_in_handshake(exc):
        return "the connection closed during the handshake"
    alert = sent_alert(exc)
    if alert is not None:
        return f"the member sent the alert {alert!r}"
    if error is not None and error.reason:
        words = error.reason.lower().replace("_", " ")
        return f"its answer is not TLS ({words})" if error.reason in _NOT_TLS else words
    return str(exc) or type(exc).__name__


def peer_cert(stream: trio.abc.Stream) -> PeerCert | None:
    """The CN and OU of the peer's certificate on a ``trio.SSLStream`` after its
    handshake; ``None`` for any other stream (or a peer that showed no certificate)."""
    if not isinstance(stream, trio.SSLStream):
        return None
    try:
        cert = stream.getpeercert()
    except ValueError:  # no handshake yet
        return None
    if not cert:
        return None
    fields: dict[str, str] = {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            fields.setdefault(key, value)
    name = fields.get("commonName")
    if name is None:
        return None
    return PeerCert(name=name, role=fields.get("organizationalUnitName", ""))


class TlsNowait:
    """Sends from the caller's task on a ``trio.SSLStream`` whose handshake is done:
    encrypts with its ``SSLObject`` and writes the records to the socket at once.

    ``trio.SSLStream`` has no such send (each ``send_all`` wakes the writer task and
    takes its locks: at one message in flight, TLS doubled the latency and the CPU per
    message), so this works with its internals, under the same rules it keeps: nothing
    is sent while its send lock is held (another task's records are on their way) or
    records it holds back wait (``_delayed_outgoing``), and records that did not fit in
    the socket go to ``_delayed_outgoing``, which every later send of the stream puts
    first, and which :meth:`drain` (the writer task) sends.  Encrypting and writing
    happen without a checkpoint in between, so nothing can come between them.
    :meth:`over` returns None where this Trio's ``SSLStream`` lacks what it relies on
    (then the writer task sends everything, as before).
    """

    __slots__ = ("_broken", "_fd", "_inner", "_ok", "_stream", "partial_writes")

    def __init__(self, stream: trio.SSLStream[trio.SocketStream], ok: object, broken: object):
        self._stream: Any = stream
        self._inner = stream.transport_stream
        self._fd = self._inner.socket.fileno()
        self._ok = ok
        self._broken = broken
        self.partial_writes = 0
        """Sends whose records did not all fit in the socket (left to :meth:`drain`)."""

    @classmethod
    def over(cls, stream: trio.SSLStream[Any]) -> TlsNowait | None:
        state = getattr(stream, "_state", None)
        needed = ("_ssl_object", "_outgoing", "_inner_send_lock", "_delayed_outgoing",
                  "_handshook")  # fmt: skip
        if (
            state is None
            or not all(hasattr(stream, name) for name in needed)
            or not hasattr(type(state), "OK")
            or not hasattr(type(state), "BROKEN")
            or not isinstance(stream.transport_stream, trio.SocketStream)
        ):
            return None
        return cls(stream, type(state).OK, type(state).BROKEN)

    def __call__(self, data: bytearray) -> int:
        stream = self._stream
        if (
            stream._state is not self._ok
            or stream._delayed_outgoing is not None
            or stream._inner_send_lock.locked()
            or stream._outgoing.pending
            or not stream._handshook.done
        ):
            return 0  # the writer task sends it, through the stream
        try:
            stream._ssl_object.write(data)
        except ssl.SSLWantReadError:  # a renegotiation (TLS 1.2) wants the peer first
            return 0
        except ssl.SSLError as exc:
            stream._state = self._broken
            raise trio.BrokenResourceError(f"TLS: {exc}") from exc
        records = stream._outgoing.read()
        try:
            sent = os.write(self._fd, records)
        except BlockingIOError:
            sent = 0
        except OSError:
            stream._state = self._broken  # some records may have gone: the stream is done
            raise
        if sent < len(records):
            stream._delayed_outgoing = records[sent:]
            self.partial_writes += 1
        return len(data)

    def owed(self) -> bool:
        return self._stream._delayed_outgoing is not None

    async def drain(self) -> None:
        """Send the records :meth:`__call__` could not (in order: under the send lock)."""
        stream = self._stream
        async with stream._inner_send_lock:
            records, stream._delayed_outgoing = stream._delayed_outgoing, None
            if records:
                try:
                    await self._inner.send_all(records)
                except BaseException:
                    stream._state = self._broken
                    raise
