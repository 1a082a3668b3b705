"""cluster.config: parsing, precedence, errors and help."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import config as cfg
from cluster.archive.segments import FsyncPolicy
from cluster.config import (
    SETTINGS,
    ConfigError,
    MemberEndpoints,
    NodeConfig,
    describe,
    format_duration,
    format_ingress_endpoints,
    load_config,
    parse_bool,
    parse_duration_ns,
    parse_members,
    parse_size,
)
from cluster.protocol.framing import DEFAULT_MAX_FRAME_SIZE

MS = 1_000_000
SECOND = 1_000_000_000


def _attr(name: str) -> str:
    return name.replace("-", "_")


def _env(name: str) -> str:
    return "CLUSTER_" + _attr(name).upper()


def write_toml(tmp_path: Path, text: str, name: str = "node.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("10s", 10 * SECOND),
        ("200ms", 200 * MS),
        ("500us", 500_000),
        ("500µs", 500_000),
        ("7ns", 7),
        ("1m", 60 * SECOND),
        ("2h", 7200 * SECOND),
        ("1.5s", 1_500_000_000),
        (" 3 s ", 3 * SECOND),
        ("5", 5 * SECOND),  # a bare number is seconds
        (2, 2 * SECOND),
        (0.25, 250 * MS),
    ],
)
def test_parse_duration(text: str | int | float, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    "text", ["", "s", "10 sec", "10S", "ten", "-1s", "1e3s", "10ms5", "1.s", ".5s", "nan", "inf"]
)
def test_parse_duration_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ns(text)


@given(ns=st.integers(1, 10**15))
@settings(max_examples=300)
def test_format_duration_round_trips(ns: int) -> None:
    assert parse_duration_ns(format_duration(ns)) == ns


def test_format_duration_picks_the_largest_exact_unit() -> None:
    assert format_duration(10 * SECOND) == "10s"
    assert format_duration(10 * MS) == "10ms"
    assert format_duration(90 * SECOND) == "90s"
    assert format_duration(120 * SECOND) == "2m"
    assert format_duration(1_500) == "1500ns"


# ---------------------------------------------------------------------- sizes, bools


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("64KiB", 64 << 10),
        ("1MiB", 1 << 20),
        ("2GiB", 2 << 30),
        ("1mib", 1 << 20),
        ("3KB", 3000),
        ("1MB", 1_000_000),
        ("1GB", 1_000_000_000),
        ("8k", 8 << 10),
        ("1m", 1 << 20),
        ("1g", 1 << 30),
        ("12B", 12),
        (" 5 MiB ", 5 << 20),
        (77, 77),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5MiB", "-1", "MiB", "1TiB", "1 Mi", "lots"])
def test_parse_size_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        (" on ", True),
        (True, True),
        ("0", False),
        ("FALSE", False),
        ("no", False),
        ("off", False),
        (False, False),
    ],
)
def test_parse_bool(text: str | bool, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool("maybe")


# ---------------------------------------------------------------------- members


def test_parse_members_good() -> None:
    members = parse_members("0=10.0.0.1:9010:9020:9030, 1=host-b:9011:9021:9031,2=[::1]:1:2:3,")
    assert members == [
        MemberEndpoints(0, "10.0.0.1", 9010, 9020, 9030),
        MemberEndpoints(1, "host-b", 9011, 9021, 9031),
        MemberEndpoints(2, "::1", 1, 2, 3),
    ]
    assert members[0].ingress == "10.0.0.1:9010"
    assert format_ingress_endpoints(members) == "0=10.0.0.1:9010,1=host-b:9011,2=::1:1"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0=a:1:2:3,0=b:4:5:6", "duplicate member ids"),
        ("0=a:1:2:70000", "port outside 1..65535"),
        ("0=a:0:2:3", "port outside 1..65535"),
        ("0=a:1:2:x", "must be integers"),
        ("x=a:1:2:3", "must be integers"),
        ("=a:1:2:3", "must be integers"),
        ("0=a:1:2", "expected id=host:ingress_port:consensus_port:admin_port"),
        ("0a:1:2:3", "expected id=host"),
        ("0=:1:2:3", "empty host"),
        ("", "no members"),
        (" , ,", "no members"),
    ],
)
def test_parse_members_bad(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_members(text)


def test_parse_members_error_names_the_bad_part() -> None:
    with pytest.raises(ValueError, match=r"'1=b:4:5'"):
        parse_members("0=a:1:2:3,1=b:4:5")


@given(
    ids=st.lists(st.integers(0, 100), min_size=1, max_size=6, unique=True),
    data=st.data(),
)
@settings(max_examples=200)
def test_parse_members_round_trip(ids: list[int], data: st.DataObject) -> None:
    port = st.integers(1, 65535)
    host = st.from_regex(r"[a-z][a-z0-9.-]{0,15}", fullmatch=True)
    members = [
        MemberEndpoints(i, data.draw(host), data.draw(port), data.draw(port), data.draw(port))
        for i in ids
    ]
    text = ",".join(
        f"{m.member_id}={m.host}:{m.ingress_port}:{m.consensus_port}:{m.admin_port}"
        for m in members
    )
    assert parse_members(text) == members


# ---------------------------------------------------------------------- defaults


def test_aeron_defaults() -> None:
    config = load_config([], {})
    assert config.session_timeout == 10 * SECOND
    assert config.slow_tick_interval == 10 * MS
    assert config.max_concurrent_sessions == 10
    assert config.leader_heartbeat_timeout == 10 * SECOND
    assert config.leader_heartbeat_interval == 200 * MS
    assert config.max_frame_size == DEFAULT_MAX_FRAME_SIZE
    assert config.fsync is FsyncPolicy.BATCH
    assert config == NodeConfig()


def test_settings_and_node_config_agree() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(NodeConfig) if f.name != "sources"}
    assert set(fields) == {_attr(s.name) for s in SETTINGS}  # (sources: where each came from)
    for s in SETTINGS:
        assert fields[_attr(s.name)] == s.default, s.name
        # every default survives a trip through its own parser via its displayed form
        assert s.parse(s.show(s.default)) == s.default, s.name


def test_single_member_default_topology() -> None:
    config = load_config(["--member-id", "4"], {})
    (member,) = config.member_list
    assert member == MemberEndpoints(
        4,
        cfg.DEFAULT_HOST,
        cfg.DEFAULT_INGRESS_PORT,
        cfg.DEFAULT_CONSENSUS_PORT,
        cfg.DEFAULT_ADMIN_PORT,
    )
    assert config.this_member == member


# ---------------------------------------------------------------------- precedence


def test_precedence_defaults_toml_env_flags(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        """
session-timeout = "20s"
max-concurrent-sessions = 3
slow_tick_interval = "20ms"
log-level = "debug"
max-frame-size = "64KiB"
""",
    )
    env = {
        "CLUSTER_SESSION_TIMEOUT": "30s",
        "CLUSTER_MAX_CONCURRENT_SESSIONS": "4",
        "CLUSTER_MAX_FRAME_SIZE": "128KiB",
        "UNRELATED": "x",
    }
    argv = ["--config", path, "--session-timeout", "40s", "--max-frame-size", "256KiB"]
    config = load_config(argv, env)
    assert config.session_timeout == 40 * SECOND  # flag beats env beats toml
    assert config.max_frame_size == 256 << 10  # flag beats env beats toml
    assert config.max_concurrent_sessions == 4  # env beats toml
    assert config.slow_tick_interval == 20 * MS  # toml (underscore key) beats default
    assert config.log_level == "DEBUG"
    assert config.election_timeout == SECOND  # default

    # each layer alone
    assert load_config(["--config", path], {}).session_timeout == 20 * SECOND
    assert load_config([], env).session_timeout == 30 * SECOND
    assert load_config(["--session-timeout", "1ms"], {}).session_timeout == MS


def test_a_setting_is_named_as_the_operator_gave_it(tmp_path: Path) -> None:
    """An error about a value names where it came from: a variable exported for another
    command (``CLUSTER_CERTS_DIR``) is not mistaken for a flag nobody passed."""
    path = write_toml(tmp_path, 'certs-dir = "a"\nsession-timeout = "20s"\n')
    env = {"CLUSTER_CERTS_DIR": "b", "CLUSTER_MAX_FRAME_SIZE": "128KiB"}
    config = load_config(["--config", path, "--max-frame-size", "64KiB"], env)
    assert config.certs_dir == "b"
    assert config.named("certs-dir") == "$CLUSTER_CERTS_DIR"  # env beats toml
    assert config.named("session-timeout") == f"session-timeout in {path}"
    assert config.named("max-frame-size") == "--max-frame-size"  # the flag beats env
    assert config.named("log-level") == "--log-level"  # not given: the flag
    assert config == load_config(["--config", path, "--max-frame-size", "64KiB"], env)


def test_config_file_from_environment_and_node_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[node]\nmember-id = 1\nmembers = "0=a:1:2:3,1=b:4:5:6"\n')
    config = load_config([], {"CLUSTER_CONFIG": path})
    assert config.member_id == 1
    assert config.this_member == MemberEndpoints(1, "b", 4, 5, 6)
    # --config wins over CLUSTER_CONFIG
    other = write_toml(tmp_path, "member-id = 0\n", name="other.toml")
    assert load_config(["--config", other], {"CLUSTER_CONFIG": path}).member_id == 0


def test_every_setting_settable_from_each_layer(tmp_path: Path) -> None:
    values = {
        "member-id": ("1", 1),
        "members": ("0=a:1:2:3,1=b:4:5:6", "0=a:1:2:3,1=b:4:5:6"),
        "dir": ("/tmp/x", "/tmp/x"),
        "certs-dir": ("/tmp/certs/member-1", "/tmp/certs/member-1"),
        "insecure": ("yes", True),
        "cluster-id": ("42", 42),
        "service": ("m:C", "m:C"),
        "on-service-error": ("STOP", "stop"),
        "authenticator": ("a:B", "a:B"),
        "admin-principals": ("root,ops", "root,ops"),
        "session-timeout": ("3s", 3 * SECOND),
        "leader-heartbeat-timeout": ("4s", 4 * SECOND),
        "leader-heartbeat-interval": ("50ms", 50 * MS),
        "election-timeout": ("2s", 2 * SECOND),
        "startup-canvass-timeout": ("5s", 5 * SECOND),
        "slow-disk-threshold": ("300ms", 300 * MS),
        "slow-disk-period": ("3s", 3 * SECOND),
        "initial-cluster-state": ("new", "new"),
        "slow-tick-interval": ("5ms", 5 * MS),
        "max-concurrent-sessions": ("7", 7),
        "max-pending-sessions": ("9", 9),
        "max-pending-per-address": ("3", 3),
        "resume-grace": ("1s", SECOND),
        "memory-trim-interval": ("2s", 2 * SECOND),
        "max-connections": ("100", 100),
        "max-connections-per-address": ("10", 10),
        "max-admin-connections": ("5", 5),
        "admin-idle-timeout": ("30s", 30 * SECOND),
        "handshake-timeout": ("2s", 2 * SECOND),
        "max-frame-size": ("2MiB", 2 << 20),
        "max-egress-backlog": ("1MiB", 1 << 20),
        "max-kept-replies": ("64KiB", 64 << 10),
        "max-session-queries": ("32", 32),
        "max-queries": ("1000", 1000),
        "ingress-quantum": ("4KiB", 4 << 10),
        "metrics-port": ("9100", 9100),
        "stall-threshold": ("10ms", 10_000_000),
        "ingress-window": ("32KiB", 32 << 10),
        "max-ingress-backlog": ("128KiB", 128 << 10),
        "max-log-inflight": ("2MiB", 2 << 20),
        "fsync": ("none", FsyncPolicy.NONE),
        "archive-io": ("Thread", "thread"),
        "segment-size": ("1MiB", 1 << 20),
        "archive-retention": ("5", 5),
        "snapshot-log-bytes": ("256KiB", 256 << 10),
        "snapshot-interval": ("10m", 600 * SECOND),
        "log-level": ("warning", "WARNING"),
        "log-format": ("JSON", "json"),
    }
    assert set(values) == {s.name for s in SETTINGS}, "add new settings to this test"
    toml = "\n".join(f'{k} = "{v}"' for k, (v, _) in values.items())
    from_toml = load_config(["--config", write_toml(tmp_path, toml)], {})
    from_env = load_config([], {_env(k): v for k, (v, _) in values.items()})
    argv = [a for k, (v, _) in values.items() for a in (f"--{k}", v)]
    from_flags = load_config(argv, {})
    for k, (_, expected) in values.items():
        for config in (from_toml, from_env, from_flags):
            assert getattr(config, _attr(k)) == expected, k


# ---------------------------------------------------------------------- errors


def test_unknown_toml_key_is_named(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'session-timeout = "1s"\nsesion-timeout = "2s"\n')
    with pytest.raises(ConfigError, match="unknown setting 'sesion-timeout'") as info:
        load_config(["--config", path], {})
    assert path in str(info.value)


@pytest.mark.parametrize(
    ("setting", "bad"),
    [
        ("session-timeout", "soon"),
        ("session-timeout", "0s"),
        ("max-concurrent-sessions", "many"),
        ("max-concurrent-sessions", "0"),
        ("max-frame-size", "huge"),
        ("fsync", "sometimes"),
        ("member-id", "one"),
    ],
)
def test_bad_value_names_setting_and_source(tmp_path: Path, setting: str, bad: str) -> None:
    path = write_toml(tmp_path, f'{setting} = "{bad}"\n')
    with pytest.raises(ConfigError, match=f"bad value for {setting} in {path}"):
        load_config(["--config", path], {})
    with pytest.raises(ConfigError, match=f"bad value for {setting} in environment"):
        load_config([], {_env(setting): bad})
    with pytest.raises(ConfigError, match=f"bad value for {setting} in command line"):
        load_config([f"--{setting}", bad], {})


@pytest.mark.parametrize(
    "toml",
    [
        "session-timeout = [1]",
        "session-timeout = inf",
        "max-frame-size = 1.5",
        "max-concurrent-sessions = [1]",
        "segment-size = {a = 1}",
        "member-id = [0]",
    ],
)
def test_wrongly_typed_toml_values_are_config_errors(tmp_path: Path, toml: str) -> None:
    setting = toml.split(" ")[0]
    path = write_toml(tmp_path, toml + "\n")
    with pytest.raises(ConfigError, match=f"bad value for {setting} in {path}"):
        load_config(["--config", path], {})


@pytest.mark.parametrize(
    "setting", ["session-timeout", "segment-size", "max-frame-size", "archive-retention"]
)
def test_toml_booleans_are_not_numbers(tmp_path: Path, setting: str) -> None:
    path = write_toml(tmp_path, f"{setting} = true\n")
    with pytest.raises(ConfigError, match=setting):
        load_config(["--config", path], {})


def test_toml_fractional_integer_is_rejected(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'members = "0=a:1:2:3,1=b:4:5:6"\nmember-id = 1.7\n')
    with pytest.raises(ConfigError, match="member-id"):
        load_config(["--config", path], {})


def test_bad_members_and_unknown_member_id() -> None:
    with pytest.raises(ConfigError, match=r"bad --members.*duplicate"):
        load_config(["--members", "0=a:1:2:3,0=b:4:5:6"], {})
    with pytest.raises(ConfigError, match="--member-id 2 is not in --members"):
        load_config(["--members", "0=a:1:2:3,1=b:4:5:6", "--member-id", "2"], {})


def test_missing_and_malformed_config_files(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["--config", missing], {})
    bad = write_toml(tmp_path, "session-timeout = \n")
    with pytest.raises(ConfigError, match="bad TOML"):
        load_config(["--config", bad], {})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------- help


def test_help_lists_every_setting_with_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside a setting's help
    with pytest.raises(SystemExit) as info:
        load_config(["--help"], {})
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out
    for s in SETTINGS:
        assert f"--{s.name}" in out, s.name
        assert f"(default: {s.show(s.default)}; env {_env(s.name)})" in out, s.name
    assert "(default: 10s;" in out
    assert "(default: 10ms;" in out


def test_unknown_flag_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_config(["--no-such-flag", "1"], {})
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_describe_shows_every_setting() -> None:
    config = load_config(["--session-timeout", "250ms", "--fsync", "NONE"], {})
    text = describe(config)
    lines = text.splitlines()
    assert len(lines) == len(SETTINGS)
    assert "  session-timeout = 250ms" in lines
    assert "  fsync = none" in lines
    assert "  max-concurrent-sessions = 10" in lines


def test_bad_log_level_and_negative_member_id() -> None:
    with pytest.raises(ConfigError, match="log-level"):
        load_config(["--log-level", "bogus"], {})
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(["--members=-1=a:1:2:3", "--member-id=-1"], {})


def test_archive_io_choice_is_checked() -> None:
    assert load_config([]).archive_io == "auto"
    with pytest.raises(ConfigError, match="archive-io"):
        load_config(["--archive-io", "async"])


@pytest.mark.parametrize("value", ["-1", "2147483648", "x"])
def test_cluster_id_must_fit_a_member_hello(value: str) -> None:
    with pytest.raises(ConfigError, match="cluster-id"):
        load_config(["--cluster-id", value], {})


def test_insecure_is_a_flag_that_takes_no_value_on_the_command_line() -> None:
    assert load_config(["--insecure"], {}).insecure is True
    assert load_config(["--insecure", "false"], {}).insecure is False
    assert load_config([], {}).insecure is False
    with pytest.raises(ConfigError, match="true or false"):
        load_config(["--insecure", "maybe"], {})


def test_archive_retention_defaults_to_two_and_refuses_a_negative_count() -> None:
    assert load_config([], {}).archive_retention == 2
    assert load_config(["--archive-retention", "0"], {}).archive_retention == 0
    with pytest.raises(ConfigError, match="archive-retention"):
        load_config([], {"CLUSTER_ARCHIVE_RETENTION": "-1"})


def test_automatic_snapshots_default_to_64mib_of_log_and_no_interval() -> None:
    config = load_config([], {})
    assert (config.snapshot_log_bytes, config.snapshot_interval) == (64 << 20, 0)
    for off in ("0", "none", "OFF"):
        assert load_config(["--snapshot-log-bytes", off], {}).snapshot_log_bytes == 0
        assert load_config(["--snapshot-interval", off], {}).snapshot_interval == 0
    assert load_config(["--snapshot-interval", "1h"], {}).snapshot_interval == 3600 * SECOND
    assert load_config([], {"CLUSTER_SNAPSHOT_LOG_BYTES": "256KiB"}).snapshot_log_bytes == 256 << 10
    lines = describe(load_config(["--snapshot-interval", "none"], {})).splitlines()
    assert "  snapshot-log-bytes = 64MiB" in lines
    assert "  snapshot-interval = off" in lines
    for bad in ("-1", "lots"):
        with pytest.raises(ConfigError, match="snapshot-log-bytes"):
            load_config(["--snapshot-log-bytes", bad], {})
    with pytest.raises(ConfigError, match="snapshot-interval"):
        load_config(["--snapshot-interval", "soon"], {})


def test_kept_replies_past_what_a_snapshot_record_holds_are_refused() -> None:
    """A session's kept replies go into one snapshot record (at most 64 MiB)."""
    assert load_config(["--max-kept-replies", "16MiB"], {}).max_kept_replies == 16 << 20
    for bad in ("17MiB", "0", "-1"):
        with pytest.raises(ConfigError, match="max-kept-replies"):
            load_config(["--max-kept-replies", bad], {})
