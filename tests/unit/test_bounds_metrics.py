"""The bounds of issue 33 are visible: refusals at accept, half-sent frames refused,
pending sessions evicted and session slots given back, on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from cluster.agents.exporter import StatusCollector
from cluster.protocol.admin import IngressStatus, MemberStatus


def exported(status: MemberStatus) -> str:
    """What ``/metrics`` says of ``status``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    return generate_latest(registry).decode()


def test_the_refusals_are_exported() -> None:
    status = MemberStatus(
        member_id=2,
        ingress=IngressStatus(refused_at_accept=5, partial_refused=3),
        counters={"evicted_pending_sessions": 7, "sessions_given_back": 11},
    )
    text = exported(status)
    assert 'triarch_ingress_refused_connections_total{member="2"} 5.0' in text
    assert 'triarch_ingress_partial_frames_refused_total{member="2"} 3.0' in text
    assert 'triarch_pending_sessions_evicted_total{member="2"} 7.0' in text
    assert 'triarch_sessions_given_back_total{member="2"} 11.0' in text


def test_the_sequencing_and_lease_counters_are_exported() -> None:
    status = MemberStatus(
        member_id=1,
        counters={"duplicate_messages": 4, "sequence_gaps": 2, "later_terms_ignored": 9},
    )
    text = exported(status)
    assert 'triarch_duplicate_messages_total{member="1"} 4.0' in text
    assert 'triarch_sequence_gaps_total{member="1"} 2.0' in text
    assert 'triarch_later_terms_ignored_total{member="1"} 9.0' in text
