"""The cluster PKI (``cluster.certs``, ``cluster-tool certs``) and loading a TLS identity
(``cluster.transport.tls.load_identity``): real files, real certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from cluster.certs import make_certs
from cluster.tool import main as tool_main
from cluster.transport.tls import TlsError, load_identity

MEMBERS = [(0, "127.0.0.1"), (1, "10.1.2.3"), (2, "Node-C.example")]
MEMBERS_TEXT = "0=127.0.0.1:9010:9020:9030,1=10.1.2.3:9011:9021:9031,2=node-c.example:1:2:3"


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def subject(c: x509.Certificate) -> dict[str, str]:
    return {attribute.rfc4514_attribute_name: str(attribute.value) for attribute in c.subject}


def eku(c: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def sans(c: x509.Certificate) -> list[str]:
    names = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(name.value) for name in names]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pki") / "certs"
    make_certs(out, MEMBERS, ["ops", "ops", "app"])
    return out


# ---------------------------------------------------------------------- layout


def test_make_certs_returns_and_writes_every_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "certs"
    created = make_certs(out, MEMBERS, ["ops", "ops", "app", "Team.Ops_2"])
    names = ["member-0", "member-1", "member-2", "client-admin", "client-app", "client-ops"]
    assert created == [out / n for n in [*names, "client-Team.Ops_2"]]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["ca.crt", "ca.key", *names, "client-Team.Ops_2"]
    )  # and no temporary folder left behind
    for folder in created:
        assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        assert (folder / "ca.crt").read_bytes() == (out / "ca.crt").read_bytes()


def test_keys_and_folders_are_private(pki: Path) -> None:
    assert mode(pki) == 0o700
    assert mode(pki / "ca.key") == 0o600
    for folder in [p for p in pki.iterdir() if p.is_dir()]:
        assert mode(folder) == 0o700, folder
        assert mode(folder / "tls.key") == 0o600, folder
        assert mode(folder / "tls.crt") == 0o644, folder


# ---------------------------------------------------------------------- contents


def test_ca_certificate(pki: Path) -> None:
    ca = cert(pki / "ca.crt")
    assert subject(ca) == {"O": "triarch", "CN": "triarch cluster CA"}
    assert ca.issuer == ca.subject
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert not usage.digital_signature
    lifetime = ca.not_valid_after_utc - ca.not_valid_before_utc
    assert dt.timedelta(days=3649) < lifetime < dt.timedelta(days=3652)
    public = ca.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert public.curve.name == "secp256r1"


def test_member_certificates(pki: Path) -> None:
    ca = cert(pki / "ca.crt")
    expected_sans = {
        0: ["127.0.0.1", "localhost"],
        1: ["10.1.2.3", "localhost", "127.0.0.1"],
        2: ["node-c.example", "localhost", "127.0.0.1"],
    }
    for member_id, _ in MEMBERS:
        c = cert(pki / f"member-{member_id}" / "tls.crt")
        assert subject(c) == {
            "O": "triarch",
            "OU": "member",
            "CN": f"member-{member_id}",
        }
        assert sorted(sans(c)) == sorted(expected_sans[member_id])
        assert eku(c) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert not c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        lifetime = c.not_valid_after_utc - c.not_valid_before_utc
        assert dt.timedelta(days=825) <= lifetime <= dt.timedelta(days=825, hours=2)
        c.verify_directly_issued_by(ca)
    ip_san = cert(pki / "member-1" / "tls.crt").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert ipaddress.ip_address("10.1.2.3") in ip_san.value.get_values_for_type(x509.IPAddress)
    assert "10.1.2.3" not in ip_san.value.get_values_for_type(x509.DNSName)


def test_member_chain_verifies_for_its_host(pki: Path) -> None:
    """A strict RFC 5280 path validation, as a TLS client would do it (hostname included)."""
    store = Store([cert(pki / "ca.crt")])
    for member_id, host in MEMBERS:
        leaf = cert(pki / f"member-{member_id}" / "tls.crt")
        for name in (host.lower(), "localhost", "127.0.0.1"):
            try:
                identity: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
            except ValueError:
                identity = x509.DNSName(name)
            verifier = PolicyBuilder().store(store).build_server_verifier(identity)
            chain = verifier.verify(leaf, [])
            assert chain[-1] == cert(pki / "ca.crt")
    with pytest.raises(x509.verification.VerificationError):
        PolicyBuilder().store(store).build_server_verifier(x509.DNSName("elsewhere")).verify(
            cert(pki / "member-2" / "tls.crt"), []
        )


def test_client_certificates(pki: Path) -> None:
    ca = cert(pki / "ca.crt")
    for name in ("admin", "app", "ops"):
        c = cert(pki / f"client-{name}" / "tls.crt")
        assert subject(c) == {
            "O": "triarch",
            "OU": "client",
            "CN": name,
        }
        assert eku(c) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
        c.verify_directly_issued_by(ca)


def test_a_certificate_from_another_pki_does_not_verify(pki: Path, tmp_path: Path) -> None:
    make_certs(tmp_path, [(0, "127.0.0.1")])
    with pytest.raises(InvalidSignature):  # the same issuer name, another key
        cert(tmp_path / "member-0" / "tls.crt").verify_directly_issued_by(cert(pki / "ca.crt"))
    store = Store([cert(pki / "ca.crt")])
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName("localhost"))
    with pytest.raises(x509.verification.VerificationError):
        verifier.verify(cert(tmp_path / "member-0" / "tls.crt"), [])


def test_days(tmp_path: Path) -> None:
    make_certs(tmp_path, [(0, "127.0.0.1")], days=30)
    c = cert(tmp_path / "member-0" / "tls.crt")
    assert dt.timedelta(days=30) <= c.not_valid_after_utc - c.not_valid_before_utc
    assert c.not_valid_after_utc - c.not_valid_before_utc <= dt.timedelta(days=30, hours=2)
    with pytest.raises(ValueError, match="days"):
        make_certs(tmp_path / "other", [(0, "127.0.0.1")], days=0)


# ---------------------------------------------------------------------- reuse


def test_existing_ca_is_reused_and_folders_kept(tmp_path: Path) -> None:
    make_certs(tmp_path, [(0, "127.0.0.1"), (1, "127.0.0.1")])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    created = make_certs(tmp_path, [(0, "127.0.0.1"), (1, "127.0.0.1"), (2, "127.0.0.1")],
                         ["ops"])  # fmt: skip
    assert created == [tmp_path / "member-2", tmp_path / "client-ops"]
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path} changed"
    ca = cert(tmp_path / "ca.crt")
    for folder in created:
        cert(folder / "tls.crt").verify_directly_issued_by(ca)
        assert (folder / "ca.crt").read_bytes() == (tmp_path / "ca.crt").read_bytes()

    assert make_certs(tmp_path, [(0, "127.0.0.1")], ["ops"]) == []


def test_half_a_ca_is_refused(tmp_path: Path) -> None:
    make_certs(tmp_path, [(0, "127.0.0.1")])
    (tmp_path / "ca.key").unlink()
    with pytest.raises(ValueError, match=r"ca\.key"):
        make_certs(tmp_path, [(1, "127.0.0.1")])
    assert not (tmp_path / "member-1").exists()


def test_a_ca_key_that_does_not_match_is_refused(tmp_path: Path) -> None:
    make_certs(tmp_path / "a", [(0, "127.0.0.1")])
    make_certs(tmp_path / "b", [(0, "127.0.0.1")])
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    with pytest.raises(ValueError, match="not the key of"):
        make_certs(tmp_path / "a", [(1, "127.0.0.1")])


@pytest.mark.parametrize(
    "name", ["", "x" * 65, "two words", "a/b", "../up", "member-0", "member-x", "héllo", "a:b"]
)
def test_bad_client_names_are_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="bad client name"):
        make_certs(tmp_path / "certs", [(0, "127.0.0.1")], ["ok", name])
    assert not (tmp_path / "certs").exists()


def test_longest_client_name_is_accepted(tmp_path: Path) -> None:
    name = "a" * 64
    assert tmp_path / f"client-{name}" in make_certs(tmp_path, [(0, "127.0.0.1")], [name])


def test_bad_members_are_refused(tmp_path: Path) -> None:
    for members in ([], [(0, "h"), (0, "h")], [(-1, "h")], [(0, "")], [(0, "bad host")]):
        with pytest.raises(ValueError, match=r"member|host"):
            make_certs(tmp_path / "certs", members)
    assert not (tmp_path / "certs").exists()


# ---------------------------------------------------------------------- the tool


def test_tool_certs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    argv = ["certs", "--members", MEMBERS_TEXT, "--out", str(out), "--client", "ops"]
    assert tool_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    folders = ["member-0", "member-1", "member-2", "client-admin", "client-app", "client-ops"]
    assert lines == [f"created {out / f}" for f in folders]
    assert sans(cert(out / "member-1" / "tls.crt")) == ["10.1.2.3", "localhost", "127.0.0.1"]

    assert tool_main([*argv, "--client", "ci-bot", "--days", "90"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"kept    {out / f}" for f in folders] + [f"created {out / 'client-ci-bot'}"]
    bot = cert(out / "client-ci-bot" / "tls.crt")
    assert bot.not_valid_after_utc - bot.not_valid_before_utc < dt.timedelta(days=91)


def test_tool_certs_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["certs", "--members", "0=127.0.0.1:1:2:3"]
    assert tool_main([*base, "--out", str(tmp_path / "a"), "--client", "member-1"]) == 2
    assert "bad client name 'member-1'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert tool_main([*base, "--out", str(blocker / "certs")]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err
    assert str(blocker) in err

    for argv in (base, [*base, "--out", str(tmp_path / "b"), "--days", "0"], ["certs"]):
        with pytest.raises(SystemExit) as info:
            tool_main(argv)
        assert info.value.code == 2, argv
    assert not (tmp_path / "b").exists()


def test_tool_certs_as_a_command(tmp_path: Path) -> None:
    """The way an operator runs it: ``python -m cluster.tool``, no cluster running."""
    done = subprocess.run(
        [sys.executable, "-m", "cluster.tool", "certs", "--members", MEMBERS_TEXT,
         "--out", str(tmp_path / "certs")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 5
    identity = load_identity(tmp_path / "certs" / "member-2")
    assert (identity.name, identity.role) == ("member-2", "member")


# ---------------------------------------------------------------------- load_identity


def test_load_identity(pki: Path) -> None:
    member = load_identity(pki / "member-1")
    assert (member.name, member.role, member.folder) == ("member-1", "member", pki / "member-1")
    client = load_identity(str(pki / "client-ops"))
    assert (client.name, client.role) == ("ops", "client")
    for context in (member.server_context, member.client_context):
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert not member.client_context.check_hostname


def copy_identity(pki: Path, folder: str, to: Path) -> Path:
    to.mkdir()
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (to / name).write_bytes((pki / folder / name).read_bytes())
    return to


@pytest.mark.parametrize("missing", ["ca.crt", "tls.crt", "tls.key"])
def test_load_identity_names_a_missing_file(pki: Path, tmp_path: Path, missing: str) -> None:
    folder = copy_identity(pki, "member-0", tmp_path / "id")
    (folder / missing).unlink()
    with pytest.raises(TlsError, match=re.escape(str(folder / missing))):
        load_identity(folder)


def test_load_identity_refuses_bad_files(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="no such directory"):
        load_identity(tmp_path / "nowhere")

    garbled = copy_identity(pki, "member-0", tmp_path / "garbled")
    (garbled / "tls.crt").write_text("not a certificate")
    with pytest.raises(TlsError, match=re.escape(str(garbled / "tls.crt"))):
        load_identity(garbled)

    wrong_key = copy_identity(pki, "member-0", tmp_path / "wrong-key")
    (wrong_key / "tls.key").write_bytes((pki / "member-1" / "tls.key").read_bytes())
    with pytest.raises(TlsError, match=re.escape(str(wrong_key / "tls.crt"))):
        load_identity(wrong_key)

    bad_key = copy_identity(pki, "member-0", tmp_path / "bad-key")
    (bad_key / "tls.key").write_text("garbage")
    with pytest.raises(TlsError, match=re.escape(str(bad_key / "tls.key"))):
        load_identity(bad_key)


def test_load_identity_refuses_a_certificate_of_another_ca(pki: Path, tmp_path: Path) -> None:
    """An impostor: a well-formed ``member-0`` certificate, but from some other CA."""
    other = trustme.CA(organization_name="triarch")
    leaf = other.issue_cert("127.0.0.1", common_name="member-0", organization_unit_name="member")
    folder = copy_identity(pki, "member-0", tmp_path / "impostor")
    (folder / "tls.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
    leaf.private_key_pem.write_to_path(str(folder / "tls.key"))
    with pytest.raises(TlsError, match="not issued by"):
        load_identity(folder)


def test_load_identity_wants_a_member_or_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", common_name="someone", organization_unit_name="staff")
    tmp_path.joinpath("ca.crt").write_bytes(ca.cert_pem.bytes())
    tmp_path.joinpath("tls.crt").write_bytes(leaf.cert_chain_pems[0].bytes())
    leaf.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    with pytest.raises(TlsError, match="OU"):
        load_identity(tmp_path)
