"""A permission error is recognised wherever it sits in an exception chain, and the
command line turns it into one line naming the role to run as, with exit 2."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from agent_blackbox.cli._roles import ROLES, RoleCheckedGroup
from agent_blackbox.schemas import (
    BlackboxError,
    PermissionRefused,
    driver_cause,
    permission_refused,
)


class _DriverError(Exception):
    """What psycopg raises: the SQLSTATE as an attribute."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class _WrappedError(Exception):
    """What SQLAlchemy raises: the driver's error as ``orig``."""

    def __init__(self, orig: Exception) -> None:
        super().__init__(f"(wrapped) {orig}\n[SQL: SELECT 1]")
        self.orig = orig


def _denied() -> _DriverError:
    return _DriverError("permission denied for table runs\nDETAIL: more", "42501")


def _translated(error: Exception) -> None:
    try:
        raise error
    except Exception as inner:
        raise BlackboxError("cannot read the ledger") from inner


def _raised_while_handling(error: Exception) -> None:
    try:
        raise error
    except Exception:
        raise ValueError("raised while handling it")  # noqa: B904


def test_a_permission_error_is_found_through_orig_cause_and_context() -> None:
    wrapped = _WrappedError(_denied())
    assert permission_refused(wrapped) == "permission denied for table runs"
    with pytest.raises(BlackboxError) as outer:
        _translated(wrapped)
    assert permission_refused(outer.value) == "permission denied for table runs"
    with pytest.raises(ValueError, match="while handling") as implicit:
        _raised_while_handling(_denied())
    assert permission_refused(implicit.value) == "permission denied for table runs"
    assert permission_refused(PermissionRefused("refused: wrong role")) == "refused: wrong role"


@pytest.mark.parametrize(
    "exc",
    [
        _DriverError("relation does not exist", "42P01"),
        _WrappedError(_DriverError("deadlock detected", "40P01")),
        PermissionError(13, "Permission denied"),  # a file, not the database
        BlackboxError("no such run"),
    ],
)
def test_other_errors_are_not_permission_errors(exc: Exception) -> None:
    assert permission_refused(exc) is None


def _cli(error: Exception) -> click.Group:
    @click.group(cls=RoleCheckedGroup)
    def top() -> None:
        pass

    @top.group("ledger")
    def ledger() -> None:
        pass

    @ledger.command("reapply")
    def reapply() -> None:
        raise error

    @top.command("relay")
    @click.option("--until-idle", default=None)
    def relay(until_idle: str | None) -> None:
        raise error

    return top


def test_the_command_line_names_the_refusal_and_the_role_and_exits_2() -> None:
    env = {"BLACKBOX_DATABASE_URL": "postgresql+psycopg://agent_7@db/blackbox"}
    result = CliRunner(env=env).invoke(_cli(_WrappedError(_denied())), ["ledger", "reapply"])
    assert result.exit_code == 2
    shown = result.output.replace("\n", " ")
    assert "the database refused `blackbox ledger reapply` (login 'agent_7')" in shown
    assert "permission denied for table runs" in shown
    assert ROLES["ledger"] in shown
    assert "Traceback" not in shown
    assert "SELECT 1" not in shown
    relay = CliRunner(env=env).invoke(_cli(_denied()), ["relay", "--until-idle", "5"])
    assert relay.exit_code == 2
    assert "`blackbox relay` (login 'agent_7')" in relay.output.replace("\n", " ")
    assert ROLES["relay"] in relay.output.replace("\n", " ")


def test_other_errors_pass_through_untouched() -> None:
    result = CliRunner().invoke(_cli(RuntimeError("boom")), ["ledger", "reapply"])
    assert isinstance(result.exception, RuntimeError)
    assert result.exit_code == 1


class _Said(Exception):
    """A driver's error whose message goes on over several lines."""


class _Wrapper(Exception):
    """What SQLAlchemy wraps a driver error in (``orig``), with the SQL and a link."""

    def __init__(self, orig: BaseException) -> None:
        super().__init__(f"({type(orig).__name__}) {orig}\n[SQL: SELECT 1]\n(Background: ...)")
        self.orig = orig


def test_the_drivers_cause_is_its_first_line_or_its_type() -> None:
    refused = _Said("connection to server failed: refused\n\tIs the server running?")
    assert driver_cause(_Wrapper(refused)) == "connection to server failed: refused"
    assert driver_cause(_Wrapper(_Said())) == "_Said"  # it said nothing
    assert driver_cause(ValueError("plain\nsecond")) == "plain"
