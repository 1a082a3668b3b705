"""``--members`` mistakes an operator makes, and the message each one gets (issue 31:
"misconfiguration is loud"), and the members digest the member links compare."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.config import (
    ConfigError,
    MemberEndpoints,
    UsageParser,
    check_members,
    host_error,
    load_config,
    members_difference,
    members_digest,
    parse_members,
)

GOOD = "0=127.0.0.1:9010:9020:9030,1=127.0.0.1:9011:9021:9031,2=127.0.0.1:9012:9022:9032"


def refused(members: str) -> str:
    """The node's message for ``--members members`` (as ``main()`` prints it)."""
    with pytest.raises(ConfigError) as caught:
        load_config(["--members", members], {})
    return str(caught.value)


# ---------------------------------------------------------------------- typos


def test_a_semicolon_for_a_comma_is_a_malformed_list_naming_the_entry() -> None:
    text = refused(
        "0=127.0.0.1:9010:9020:9030;1=127.0.0.1:9011:9021:9031,2=127.0.0.1:9012:9022:9032"
    )
    assert text == (
        "bad --members: bad member '0=127.0.0.1:9010:9020:9030;1=127.0.0.1:9011:9021:9031': "
        "more than one member in one entry (separate members with ',', not ';')"
    )
    assert "loopback" not in text


def test_a_space_for_a_comma_is_named_too() -> None:
    text = refused("0=127.0.0.1:9010:9020:9030 1=127.0.0.1:9011:9021:9031")
    assert "more than one member in one entry (separate members with ',', not ' ')" in text


def test_a_trailing_semicolon_names_the_port_it_spoils() -> None:
    text = refused("0=127.0.0.1:9010:9020:9030;")
    assert "bad member '0=127.0.0.1:9010:9020:9030;'" in text
    assert "not '9030;'" in text
    assert "(separate members with ',', not ';')" in text


@pytest.mark.parametrize(
    "host", ["127.0.0.l", "127.0.O.1", "10.0.0.256", "1.2.3", "127.0.0.1.5", "1.2.3.4.", "0x7f.1"]
)
def test_an_ip_address_with_a_typo_is_not_an_ip_address(host: str) -> None:
    text = refused(f"0={host}:9010:9020:9030")
    assert f"bad member '0={host}:9010:9020:9030': host '{host}' is not an IP address" in text
    assert "loopback" not in text


@pytest.mark.parametrize("host", ["a..b", "-node", "node-", "no de", "x" * 64, "node!", "a/b"])
def test_a_host_that_is_no_host_name_is_refused(host: str) -> None:
    text = refused(f"0={host}:9010:9020:9030")
    assert f"host '{host}' is not an IP address or a valid host name" in text


def test_a_bad_ipv6_address_is_refused() -> None:
    assert "host '::g' is not an IP address" in refused("0=[::g]:9010:9020:9030")


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "10.1.2.3",
        "::1",
        "fe80::1%eth0",
        "localhost",
        "localhost.",
        "node-c.example",
        "db_1",
        "3com.example",
        "a" * 63 + ".example",
    ],
)
def test_addresses_and_host_names_are_accepted(host: str) -> None:
    assert host_error(host) == ""
    shown = f"[{host}]" if ":" in host else host
    assert check_members(parse_members(f"0={shown}:1:2:3"))[0].host == host


@pytest.mark.parametrize(
    ("ports", "roles"),
    [
        ("9010:9010:9030", "ingress and consensus ports are both 9010"),
        ("9010:9020:9020", "consensus and admin ports are both 9020"),
        ("9030:9020:9030", "ingress and admin ports are both 9030"),
    ],
)
def test_one_port_twice_in_a_member_is_refused(ports: str, roles: str) -> None:
    text = refused(f"0=127.0.0.1:{ports}")
    assert text == (
        f"bad --members: bad member '0=127.0.0.1:{ports}': its {roles} "
        "(each needs a port of its own)"
    )


def test_one_host_port_in_two_members_is_refused() -> None:
    text = refused("0=127.0.0.1:9010:9020:9030,1=127.0.0.1:9011:9021:9020")
    assert text == (
        "bad --members: members 0 and 1 both use 127.0.0.1:9020 (member 0's consensus "
        "port and member 1's admin port): each port can be used once"
    )


def test_one_host_port_spelt_two_ways_is_still_one() -> None:
    assert "both use" in refused("0=[::1]:1:2:3,1=[0:0::1]:4:5:1")
    assert "both use" in refused("0=Node-A:1:2:3,1=node-a.:4:5:2")


def test_one_port_on_different_hosts_is_fine() -> None:
    config = load_config(
        ["--members", "0=10.0.0.1:9010:9020:9030,1=10.0.0.2:9010:9020:9030", "--insecure"], {}
    )
    assert [m.host for m in config.member_list] == ["10.0.0.1", "10.0.0.2"]


def test_the_tools_check_hosts_but_not_ports(capsys: pytest.CaptureFixture[str]) -> None:
    """``cluster-tool`` and ``cluster-tui`` bind nothing: their ``--members`` may repeat a
    port (a list of placeholders), but not hold a host that is no host."""
    parser = UsageParser(prog="cluster-tool")
    assert len(parser.members("0=127.0.0.1:1:1:1,1=127.0.0.1:1:1:1")) == 2
    with pytest.raises(SystemExit) as exit_:
        parser.members("0=127.0.0.l:1:2:3")
    assert exit_.value.code == 2
    assert "--members: bad member '0=127.0.0.l:1:2:3': host '127.0.0.l' is not an IP" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------------------- digest


MEMBERS = parse_members(GOOD)


def test_digest_is_short_stable_and_ignores_order_and_spelling() -> None:
    digest = members_digest(MEMBERS)
    assert len(digest) == 4 + 4 * len(MEMBERS)
    assert members_digest(list(reversed(MEMBERS))) == digest
    assert members_digest(parse_members(GOOD.replace("127.0.0.1", "127.000.0.1"))) != digest
    spelt = parse_members("0=[0:0::1]:1:2:3,1=Host.:4:5:6")
    assert members_digest(spelt) == members_digest(parse_members("0=[::1]:1:2:3,1=host:4:5:6"))
    # pinned: members of two versions compare digests in their hellos
    assert digest.hex() == "c0be322c3bf763193aac8cd36cf81d1e"


def test_no_difference_for_the_same_list_or_an_empty_digest() -> None:
    assert members_difference(MEMBERS, members_digest(MEMBERS)) is None
    assert members_difference(MEMBERS, b"") is None


def test_an_address_difference_names_the_member() -> None:
    other = parse_members(GOOD.replace("9032", "9033"))
    same_ids, words = members_difference(MEMBERS, members_digest(other)) or (None, "")
    assert same_ids is True
    assert words == (
        "the same member ids, but its entries for member 2 differ from ours "
        "(2=127.0.0.1:9012:9022:9032)"
    )


def test_other_member_ids_are_told_apart_from_other_addresses() -> None:
    other = parse_members(GOOD + ",3=127.0.0.1:9013:9023:9033")
    same_ids, words = members_difference(MEMBERS, members_digest(other)) or (None, "")
    assert same_ids is False
    assert words.startswith("other member ids (it lists 4 members, we list 3: 0=127.0.0.1:")
    assert "our entries for" not in words  # all three of ours are in its list
    fewer = parse_members("0=127.0.0.1:9010:9020:9030,3=127.0.0.1:9013:9023:9033")
    same_ids, words = members_difference(MEMBERS, members_digest(fewer)) or (None, "")
    assert same_ids is False
    assert words.endswith("; our entries for members 1, 2 are not in its list")


def test_a_digest_of_another_shape_is_shown_as_it_is() -> None:
    same_ids, words = members_difference(MEMBERS, b"\x01\x02\x03") or (None, "")
    assert same_ids is False
    assert words.startswith("its members digest 010203 is not ours ")


@given(
    ids=st.lists(st.integers(0, 100), min_size=1, max_size=6, unique=True),
    data=st.data(),
)
@settings(max_examples=100)
def test_digest_differs_exactly_when_the_lists_differ(ids: list[int], data: st.DataObject) -> None:
    host = st.sampled_from(["127.0.0.1", "10.0.0.2", "node-a", "::1"])
    port = st.integers(1, 65535)
    members = [
        MemberEndpoints(i, data.draw(host), data.draw(port), data.draw(port), data.draw(port))
        for i in ids
    ]
    changed = list(members)
    k = data.draw(st.integers(0, len(members) - 1))
    changed[k] = MemberEndpoints(
        members[k].member_id, members[k].host, members[k].ingress_port % 65535 + 1, 1, 1
    )
    assert members_digest(data.draw(st.permutations(members))) == members_digest(members)
    assert members_digest(changed) != members_digest(members)
    same_ids, words = members_difference(members, members_digest(changed)) or (None, "")
    assert same_ids is True
    assert f"entries for member {members[k].member_id} differ" in words


@settings(max_examples=300)
@given(st.binary(max_size=4096))
def test_a_strangers_members_digest_is_described_never_raises(digest: bytes) -> None:
    """Whatever bytes a hello carries as its digest, comparing them says how the lists
    differ (or that they do not) and never raises."""
    found = members_difference(MEMBERS, digest)
    assert found is None or isinstance(found[1], str)
