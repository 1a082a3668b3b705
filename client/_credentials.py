"""Credentials for the connect handshake (Aeron's ``CredentialsSupplier``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from cluster.transport.tls import TlsError, TlsIdentity, load_client_identity

from .errors import CertsDirError

__all__ = ["CredentialsSupplier", "StaticCredentials", "as_credentials_supplier"]


@runtime_checkable
class CredentialsSupplier(Protocol):
    """Supplies the credentials sent while connecting.

    Implement both methods (or subclass this class to inherit the defaults, which send
    empty credentials and answer every challenge with empty bytes).
    """

    def encoded_credentials(self) -> bytes:
        """Credentials sent in the ``SessionConnectRequest``."""
        return b""

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        """Answer to a ``Challenge`` from the cluster, sent in a ``ChallengeResponse``."""
        return b""


class StaticCredentials(CredentialsSupplier):
    """Fixed credentials, and an optional fixed answer to every challenge."""

    __slots__ = ("_challenge_response", "_credentials")

    def __init__(self, credentials: bytes = b"", challenge_response: bytes = b"") -> None:
        self._credentials = bytes(credentials)
        self._challenge_response = bytes(challenge_response)

    def encoded_credentials(self) -> bytes:
        return self._credentials

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return self._challenge_response


def as_credentials_supplier(credentials: bytes | CredentialsSupplier | None) -> CredentialsSupplier:
    """Turn the ``credentials`` option of :func:`client.connect` into a supplier."""
    if credentials is None:
        return StaticCredentials()
    if isinstance(credentials, bytes | bytearray | memoryview):
        return StaticCredentials(bytes(credentials))
    if isinstance(credentials, CredentialsSupplier):
        return credentials
    raise TypeError(
        "credentials must be bytes, a CredentialsSupplier or None, "
        f"not {type(credentials).__name__}"
    )


def load_certs(certs_dir: str | os.PathLike[str]) -> TlsIdentity:
    """A client's certificate folder (``client-NAME``), or :class:`CertsDirError`
    saying why it is not one (a member's folder, an expired certificate, a missing file)."""
    try:
        return load_client_identity(Path(certs_dir), user="the client", preferred="app")
    except TlsError as exc:
        raise CertsDirError(f"certs_dir: {exc}") from None
