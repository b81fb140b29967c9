"""A consumer whose static membership Kafka fences (as a group coordinator's failover
can do to a member alone with its id) drops its client and joins again, a few times a
minute; fenced more often, another consumer holds its id and it fails, saying so."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from agent_blackbox.broker import KafkaUnavailable
from agent_blackbox.consumers._errors import MemberFenced
from agent_blackbox.consumers._group_member import GroupMember
from agent_blackbox.schemas import Settings

FENCED = "Static consumer fenced by other consumer with same group.instance.id"


class _Client:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _member(instance_id: str | None = "views@host") -> tuple[GroupMember, _Client]:
    member = GroupMember(
        Settings(),
        name="views",
        group_id="g",
        instance_id=instance_id,
        client_config={},
        batch_size=10,
    )
    client = _Client()
    member._client = client  # type: ignore[assignment]  # as join() leaves it
    return member, client


def _fatal(reason: str = FENCED) -> Any:
    return KafkaError(KafkaError._FATAL, reason, fatal=True)


def test_a_fenced_member_drops_its_client_to_join_again() -> None:
    member, client = _member()
    with pytest.raises(MemberFenced, match="joining again"):
        member.handle_error(_fatal())
    assert client.closed
    assert not member.joined  # the runtime's start() joins again with a new client


def test_fenced_again_and_again_another_consumer_has_the_id() -> None:
    member, _ = _member()
    for _ in range(3):
        with pytest.raises(MemberFenced):
            member.handle_error(_fatal())
        member._client = _Client()  # type: ignore[assignment]  # joined again
    with pytest.raises(KafkaUnavailable, match="give each its own") as raised:
        member.handle_error(_fatal())
    assert not isinstance(raised.value, MemberFenced)


def test_other_fatal_errors_and_dynamic_members_fail_as_before() -> None:
    member, _ = _member()
    with pytest.raises(KafkaUnavailable) as raised:
        member.handle_error(_fatal("Local: Broker transport failure"))
    assert not isinstance(raised.value, MemberFenced)
    dynamic, _ = _member(instance_id=None)
    with pytest.raises(KafkaUnavailable) as raised:
        dynamic.handle_error(_fatal())
    assert not isinstance(raised.value, MemberFenced)
