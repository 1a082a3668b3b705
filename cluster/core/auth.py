"""Authentication of client sessions (Aeron's Authenticator / SessionProxy).

The consensus module calls the :class:`Authenticator` as a connection progresses:

1. :meth:`Authenticator.on_connect_request` with the credentials of the
   SessionConnectRequest;
2. :meth:`Authenticator.on_connected_session` on every slow tick until the
   authenticator decides: ``authenticate``, ``challenge`` or ``reject`` through the
   :class:`SessionProxy` (answers go back on the request's connection);
3. after a challenge, :meth:`Authenticator.on_challenge_response` with the client's
   answer, then :meth:`Authenticator.on_challenged_session` on each slow tick until it
   decides;
4. :meth:`Authenticator.on_pending_ended` once the session is no longer pending, however
   that came about: nothing need be kept for it after.

With TLS, the name on the client's certificate is the principal (``authenticate`` cannot
change it); :attr:`SessionProxy.principal` shows it to the authenticator.

Authenticators run in the consensus module, not in the replicated service, so they may
use randomness and wall-clock time.
"""

from __future__ import annotations

from typing import Protocol


class SessionProxy(Protocol):
    """What an authenticator may do to a session waiting for its decision."""

    @property
    def session_id(self) -> int: ...

    @property
    def principal(self) -> str | None:
        """The name on the client's certificate (None without TLS)."""
        ...

    def challenge(self, encoded_challenge: bytes) -> bool:
        """Send a Challenge to the client; the session becomes CHALLENGED."""
        ...

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        """Accept the session, naming its principal; the session becomes AUTHENTICATED."""
        ...

    def reject(self) -> None:
        """Reject the session: the client gets AUTHENTICATION_REJECTED."""
        ...


class Authenticator:
    """Base authenticator; the default accepts every session as an anonymous principal."""

    #: Whether this authenticator really checks identities.  With the default
    #: authenticator every client is anonymous, so principals mean nothing.
    enforces_identity: bool = False

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        """Called when a SessionConnectRequest arrives (egress not yet connected)."""

    def on_challenge_response(
        self, session_id: int, encoded_credentials: bytes, now_ms: int
    ) -> None:
        """Called with the client's ChallengeResponse."""

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        """Called on each slow tick for a CONNECTED session until a decision is made."""
        proxy.authenticate(b"")

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        """Called on each slow tick for a CHALLENGED session until a decision is made."""

    def on_pending_ended(self, session_id: int) -> None:
        """The pending session left: opened, rejected, timed out, its connection closed,
        or the leader stepped down.  Drop whatever is kept for it."""


DefaultAuthenticator = Authenticator
"""Aeron's name for the accept-everything authenticator."""


class AuthorisationService:
    """Decides who may run admin actions (snapshot, suspend, resume, shutdown, abort).

    The default allows everyone, which is right only when every client is anonymous
    (no authenticator): the node says so at start-up.  With an authenticator, use
    :class:`AdminPrincipals`.
    """

    def is_authorised(self, action: str, encoded_principal: bytes) -> bool:
        return True


class AdminPrincipals(AuthorisationService):
    """Only the named principals (as the authenticator reported them) may act."""

    def __init__(self, principals: set[bytes]) -> None:
        self.principals = principals

    def is_authorised(self, action: str, encoded_principal: bytes) -> bool:
        return encoded_principal in self.principals
