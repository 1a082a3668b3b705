"""The example authenticator: a secret per principal, nothing kept past a pending session."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.examples.auth import (
    MAX_PRINCIPAL,
    SharedSecretAuthenticator,
    answer,
    load_secrets,
)


class Proxy:
    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.principal: str | None = None
        self.challenged: bytes | None = None
        self.decision: tuple[str, bytes] | None = None

    def challenge(self, encoded_challenge: bytes) -> bool:
        self.challenged = encoded_challenge
        return True

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        self.decision = ("ok", encoded_principal)
        return True

    def reject(self) -> None:
        self.decision = ("rejected", b"")


def run(auth: SharedSecretAuthenticator, sid: int, principal: bytes, secret: bytes) -> Proxy:
    proxy = Proxy(sid)
    auth.on_connect_request(sid, principal, 0)
    auth.on_connected_session(proxy, 0)
    if proxy.decision is None:
        assert proxy.challenged is not None
        auth.on_challenge_response(sid, answer(secret, proxy.challenged), 0)
        auth.on_challenged_session(proxy, 0)
    return proxy


def test_each_principal_proves_its_own_secret() -> None:
    auth = SharedSecretAuthenticator({b"app": b"a-secret", b"admin": b"root-secret"})
    assert run(auth, 1, b"app", b"a-secret").decision == ("ok", b"app")
    assert run(auth, 2, b"admin", b"root-secret").decision == ("ok", b"admin")
    # app's secret does not make anyone admin; unknown names are challenged and refused
    assert run(auth, 3, b"admin", b"a-secret").decision == ("rejected", b"")
    assert run(auth, 4, b"nobody", b"a-secret").decision == ("rejected", b"")
    assert auth.pending_state == 0


def test_nothing_is_kept_past_a_pending_session() -> None:
    auth = SharedSecretAuthenticator({b"app": b"s"})
    for sid in range(1, 201):  # connect requests that never answer the challenge
        auth.on_connect_request(sid, b"app", 0)
        auth.on_connected_session(Proxy(sid), 0)
    assert auth.pending_state == 200
    for sid in range(1, 201):
        auth.on_pending_ended(sid)  # timed out, connection closed, leader stepped down
    assert auth.pending_state == 0
    # a megabyte of credentials is refused without being kept
    proxy = Proxy(999)
    auth.on_connect_request(999, b"x" * (1 << 20), 0)
    assert auth.pending_state == 0
    auth.on_connected_session(proxy, 0)
    assert proxy.decision == ("rejected", b"")
    assert len(b"x" * MAX_PRINCIPAL) == MAX_PRINCIPAL


def test_the_secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secrets"
    path.write_text("# principal secret\napp  app-secret\nadmin root-secret  # ops\n\n")
    assert load_secrets(path) == {b"app": b"app-secret", b"admin": b"root-secret"}
    monkeypatch.setenv("CLUSTER_SECRETS_FILE", str(path))
    assert SharedSecretAuthenticator().secrets[b"admin"] == b"root-secret"
    for bad, why in (
        ("app\n", "expected 'principal secret'"),
        ("app a b\n", "expected 'principal secret'"),
        ("app a\napp b\n", "given twice"),
        ("# nothing\n", "no principals"),
    ):
        path.write_text(bad)
        with pytest.raises(ValueError, match=why):
            load_secrets(path)
    monkeypatch.delenv("CLUSTER_SECRETS_FILE")
    with pytest.raises(ValueError, match="CLUSTER_SECRETS_FILE"):
        SharedSecretAuthenticator()
