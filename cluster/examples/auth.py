"""A challenge/response authenticator: each principal proves it knows its own secret.

The connect request's credentials name the principal; the node sends a random nonce as
the Challenge; the client answers ``HMAC-SHA256(secret of that principal, nonce)``.  So
knowing ``app``'s secret lets a client be ``app`` and nobody else: ``admin`` needs
``admin``'s secret.

Configure the node with ``--authenticator cluster.examples.auth:SharedSecretAuthenticator``
and ``CLUSTER_SECRETS_FILE`` naming a file of ``principal secret`` lines (``#`` starts a
comment; keep it readable by the node only); clients use :class:`SharedSecretCredentials`.

Nothing is kept past a pending session: what a session's connect request and challenge
left here is dropped when the session is decided, times out or loses its connection
(:meth:`~cluster.core.auth.Authenticator.on_pending_ended`).  A principal longer than
:data:`MAX_PRINCIPAL` bytes is rejected at once, and an unknown principal is challenged
like any other (the answer cannot match), so the node does not say which names exist.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from ..core.auth import Authenticator, SessionProxy

MAX_PRINCIPAL = 256
"""Bytes of a principal name; longer credentials are rejected without being kept."""


def answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def load_secrets(path: str | os.PathLike[str]) -> dict[bytes, bytes]:
    """``principal secret`` lines of a file; ValueError naming the line if malformed."""
    table: dict[bytes, bytes] = {}
    text = Path(path).read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'principal secret'")
        principal, secret = (f.encode() for f in fields)
        if len(principal) > MAX_PRINCIPAL:
            raise ValueError(f"{path}:{number}: principal longer than {MAX_PRINCIPAL} bytes")
        if principal in table:
            raise ValueError(f"{path}:{number}: principal {fields[0]!r} given twice")
        table[principal] = secret
    if not table:
        raise ValueError(f"{path}: no principals")
    return table


class SharedSecretAuthenticator(Authenticator):
    enforces_identity = True

    def __init__(self, principal_secrets: Mapping[bytes, bytes] | None = None) -> None:
        if principal_secrets is None:
            path = os.environ.get("CLUSTER_SECRETS_FILE", "")
            if not path:
                raise ValueError(
                    "SharedSecretAuthenticator needs CLUSTER_SECRETS_FILE "
                    "(a file of 'principal secret' lines)"
                )
            principal_secrets = load_secrets(path)
        self.secrets = dict(principal_secrets)
        # per pending session only: dropped when it is decided or ends
        self._principals: dict[int, bytes] = {}
        self._nonces: dict[int, bytes] = {}
        self._answers: dict[int, bytes] = {}

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        if len(encoded_credentials) <= MAX_PRINCIPAL:
            self._principals[session_id] = bytes(encoded_credentials)

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        sid = proxy.session_id
        if sid not in self._principals:  # over-long credentials: not kept, refused
            self.on_pending_ended(sid)
            proxy.reject()
            return
        nonce = secrets.token_bytes(16)
        if proxy.challenge(nonce):
            self._nonces[sid] = nonce

    def on_challenge_response(
        self, session_id: int, encoded_credentials: bytes, now_ms: int
    ) -> None:
        if session_id in self._nonces:
            self._answers[session_id] = bytes(encoded_credentials[:64])

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        sid = proxy.session_id
        if sid not in self._answers:
            return
        given = self._answers.get(sid, b"")
        nonce = self._nonces.get(sid, b"")
        principal = self._principals.get(sid, b"")
        self.on_pending_ended(sid)
        secret = self.secrets.get(principal)
        # an unknown principal is checked against a random secret: same work, no match
        expected = answer(secret if secret is not None else secrets.token_bytes(32), nonce)
        if nonce and secret is not None and hmac.compare_digest(given, expected):
            proxy.authenticate(principal)
        else:
            proxy.reject()

    def on_pending_ended(self, session_id: int) -> None:
        self._principals.pop(session_id, None)
        self._nonces.pop(session_id, None)
        self._answers.pop(session_id, None)

    @property
    def pending_state(self) -> int:
        """Sessions this authenticator holds anything for (bounded by pending sessions)."""
        return len(self._principals.keys() | self._nonces.keys() | self._answers.keys())


class SharedSecretCredentials:
    """Client side: a :class:`client.CredentialsSupplier` for a principal's secret."""

    def __init__(self, principal: bytes, secret: bytes) -> None:
        self.principal = principal
        self.secret = secret

    def encoded_credentials(self) -> bytes:
        return self.principal

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return answer(self.secret, encoded_challenge)
