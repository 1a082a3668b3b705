"""``cluster-kv``'s command line without a cluster: what it refuses (exit 2, one line
after the usage), how it reads ``--members`` (the members' list or ingress endpoints,
``CLUSTER_MEMBERS``), and how it prints values that are not UTF-8."""

from __future__ import annotations

import pytest

from cluster.examples.kv_cli import (
    EXIT_USAGE,
    _one_line_text,
    _text,
    _value_fields,
    build_parser,
    main,
)

MEMBERS = "0=127.0.0.1:9010:9020:9030,1=127.0.0.1:9011:9021:9031"


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a command line ``main`` refuses (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: cluster-kv")
    assert lines[-1].startswith("cluster-kv")
    assert ": error: " in lines[-1]
    return lines[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["get"], "the following arguments are required: KEY"),
        (["frobnicate", "k"], "invalid choice: 'frobnicate'"),
        (["put", "k"], "the following arguments are required: VALUE"),
        (["cas", "k", "old"], "cas takes KEY OLD NEW"),
        (["cas", "--absent", "k", "old", "new"], "cas takes KEY NEW with --absent"),
        (["get", "k", "--consistency", "stale"], "invalid choice: 'stale'"),
        (["put", "k", "v", "--ttl", "-1s"], "--ttl"),
        (["--timeout", "0s", "get", "k"], "must be positive"),
        (["get", "\udcff"], "KEY '\\udcff' is not UTF-8 text"),
        (["--members", "0=127.0.0.1:x", "get", "k"], "port 'x' is not a number"),
        (["--members", "0=h:1:2:x", "get", "k"], "id and ports must be integers, not 'x'"),
        (["--members", "0=bad host:1:2:3", "get", "k"], "--members: bad member"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLUSTER_MEMBERS", MEMBERS)
    assert message in refused(argv, capsys)


def test_members_come_from_the_environment_or_are_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLUSTER_MEMBERS", raising=False)
    assert "--members is required (or set CLUSTER_MEMBERS)" in refused(["get", "k"], capsys)
    seen: list[str] = []

    def fake_run(run: object, args: object, endpoints: str) -> int:
        seen.append(endpoints)
        return 0

    monkeypatch.setattr("cluster.examples.kv_cli.trio.run", fake_run)
    monkeypatch.setenv("CLUSTER_MEMBERS", MEMBERS)
    assert main(["get", "k"]) == 0
    assert main(["--members", "0=127.0.0.1:7000", "get", "k"]) == 0  # ingress endpoints
    assert main(["get", "k", "--members", "3=[::1]:7001:7002:7003"]) == 0  # after the command
    assert seen == ["0=127.0.0.1:9010,1=127.0.0.1:9011", "0=127.0.0.1:7000", "3=[::1]:7001"]


def test_options_go_before_or_after_the_command() -> None:
    parser = build_parser()
    first = parser.parse_args(["--json", "--timeout", "2s", "watch", "a/"])
    after = parser.parse_args(["watch", "a/", "--json", "--timeout", "2s"])
    for args in (first, after):
        assert (args.json, args.timeout, args.prefix) == (True, 2.0, "a/")
    assert parser.parse_args(["cas", "--absent", "k", "v"]).values == ["v"]


def test_values_that_are_not_utf8_are_escaped_or_given_in_base64() -> None:
    assert _text(b"caf\xc3\xa9") == "café"
    assert _text(b"\xff\x00ok") == "\\xff\x00ok"
    assert _one_line_text(b"two\nlines\r\n") == "two\\nlines\\r\\n"
    assert _value_fields(b"caf\xc3\xa9") == {"value": "café"}
    assert _value_fields(b"\xff\xfeok") == {"value_base64": "//5vaw=="}
    assert _value_fields(None) == {"value": None}
