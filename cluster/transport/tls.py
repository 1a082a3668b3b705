"""Mutual TLS for :class:`~cluster.transport.tcp.TcpNetwork`.

An identity is one folder made by ``cluster-tool certs`` (:mod:`cluster.certs`):
``ca.crt``, ``tls.crt``, ``tls.key``.  Both sides present their certificate and accept
only certificates of that CA (``CERT_REQUIRED`` both ways).  Host names are not checked:
a peer is known by its certificate's name (:func:`peer_cert`: the CN, and the OU that
says ``member`` or ``client``), which the agents match against who the peer claims to be.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
