"""A challenge/response authenticator: proves a client knows a shared secret.

The node sends a random nonce as the Challenge; the client answers with
``HMAC-SHA256(secret, nonce)``.  The connect request's credentials name the principal.
Configure the node with ``--authenticator cluster.examples.auth:SharedSecretAuthenticator``
and the secret in ``CLUSTER_SHARED_SECRET``; clients use :class:`SharedSecretCredentials`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from ..core.auth import Authenticator, SessionProxy


def answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


class SharedSecretAuthenticator(Authenticator):
    enforces_identity = True

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is None:
            env = os.environ.get("CLUSTER_SHARED_SECRET", "")
            if not env:
                raise ValueError("SharedSecretAuthenticator needs CLUSTER_SHARED_SECRET")
            secret = env.encode()
        self.secret = secret
        self._principals: dict[int, bytes] = {}
        self._nonces: dict[int, bytes] = {}
        self._answers: dict[int, bytes] = {}

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        self._principals[session_id] = encoded_credentials

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        nonce = secrets.token_bytes(16)
        if proxy.challenge(nonce):
            self._nonces[proxy.session_id] = nonce

    def on_challenge_response(
        self, session_id: int, encoded_credentials: bytes, now_ms: int
    ) -> None:
        self._answers[session_id] = encoded_credentials

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        sid = proxy.session_id
        if sid not in self._answers:
            return
        given = self._answers.pop(sid)
        nonce = self._nonces.pop(sid, b"")
        principal = self._principals.pop(sid, b"")
        if nonce and hmac.compare_digest(given, answer(self.secret, nonce)):
            proxy.authenticate(principal)
        else:
            proxy.reject()


class SharedSecretCredentials:
    """Client side: a :class:`client.CredentialsSupplier` for the shared secret."""

    def __init__(self, principal: bytes, secret: bytes) -> None:
        self.principal = principal
        self.secret = secret

    def encoded_credentials(self) -> bytes:
        return self.principal

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return answer(self.secret, encoded_challenge)
