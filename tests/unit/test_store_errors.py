"""Whose fault a PostgreSQL error is: decided from the server's and the connection's evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import errors
from psycopg_pool import PoolTimeout

from kinbox.core.errors import ConflictError, StoreError
from kinbox.store.errors import Blame, behind, blame, translate

pytestmark = pytest.mark.unit


@dataclass
class Info:
    """What a connection's ``info`` reports of the server."""

    parameters: dict[str, str] = field(default_factory=dict)

    def parameter_status(self, name: str) -> str | None:
        return self.parameters.get(name)


@dataclass
class Conn:
    """A connection as the classification reads it."""

    broken: bool = False
    info: Info = field(
        default_factory=lambda: Info(
            {"in_hot_standby": "off", "default_transaction_read_only": "off"}
        )
    )


HEALTHY = Conn()
LOST = Conn(broken=True)
STANDBY = Conn(info=Info({"in_hot_standby": "on", "default_transaction_read_only": "off"}))
WRITES_OFF = Conn(info=Info({"in_hot_standby": "off", "default_transaction_read_only": "on"}))
OLD_SERVER = Conn(info=Info({}))  # before 14: neither is reported

CASES: list[tuple[BaseException, Conn | None, bool, Blame]] = [
    # No connection in hand: a failed connect, the pool's timeout
    (psycopg.OperationalError("connection refused"), None, False, "outage"),
    (PoolTimeout("couldn't get a connection after 30.00 sec"), None, False, "outage"),
    (psycopg.InterfaceError("the connection is closed"), None, True, "outage"),
    # The connection lost: whatever was raised
    (psycopg.OperationalError("server closed the connection unexpectedly"), LOST, False, "outage"),
    (errors.CheckViolation(), LOST, False, "outage"),
    (ValueError("raised by the handler"), LOST, False, "outage"),
    # psycopg's own errors on a healthy connection: nothing about the server
    (errors.PipelineAborted("pipeline aborted"), HEALTHY, False, "event"),
    (psycopg.OperationalError("the connection is closed"), HEALTHY, False, "event"),
    (psycopg.InterfaceError("the cursor is closed"), HEALTHY, False, "event"),
    (psycopg.NotSupportedError("COPY cannot be used in pipeline mode"), HEALTHY, False, "event"),
    (
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
        HEALTHY,
        True,
        "event",
    ),
    (errors.InFailedSqlTransaction(), HEALTHY, False, "event"),
    # The server going away, by SQLSTATE
    (errors.AdminShutdown(), HEALTHY, False, "outage"),
    (errors.CrashShutdown(), HEALTHY, False, "outage"),
    (errors.CannotConnectNow(), HEALTHY, True, "outage"),
    (errors.DatabaseDropped(), HEALTHY, False, "outage"),
    (errors.IdleSessionTimeout(), HEALTHY, False, "outage"),
    (errors.ConnectionFailure(), HEALTHY, False, "outage"),
    (errors.TooManyConnections(), HEALTHY, False, "outage"),
    (errors.DiskFull(), HEALTHY, False, "outage"),
    (errors.OutOfMemory(), HEALTHY, False, "outage"),
    (errors.ConfigurationLimitExceeded(), HEALTHY, False, "event"),  # temp_file_limit
    (errors.OperatorIntervention(), HEALTHY, False, "event"),
    # Read-only: an outage only when the server refuses every transaction's writes
    (errors.ReadOnlySqlTransaction(), STANDBY, False, "outage"),
    (errors.ReadOnlySqlTransaction(), WRITES_OFF, False, "outage"),
    (errors.ReadOnlySqlTransaction(), OLD_SERVER, False, "outage"),
    (errors.ReadOnlySqlTransaction(), HEALTHY, False, "event"),
    # Conflicts
    (errors.SerializationFailure(), HEALTHY, False, "conflict"),
    (errors.DeadlockDetected(), HEALTHY, True, "conflict"),
    (errors.TransactionIntegrityConstraintViolation(), HEALTHY, False, "event"),
    (errors.StatementCompletionUnknown(), HEALTHY, False, "event"),
    # Waits: kinbox's own statements only
    (errors.LockNotAvailable(), HEALTHY, True, "wait"),
    (errors.LockNotAvailable(), HEALTHY, False, "event"),
    (errors.QueryCanceled(), HEALTHY, True, "wait"),
    (errors.QueryCanceled(), HEALTHY, False, "event"),
    # Damage or a file one handler's rows meet: the event's (the breaker guards the rest)
    (errors.IndexCorrupted(), HEALTHY, False, "event"),
    (errors.DataCorrupted(), HEALTHY, False, "event"),
    (errors.UndefinedFile(), HEALTHY, False, "event"),
    (errors.IoError(), HEALTHY, False, "event"),
    # Content the database refuses
    (errors.ProgramLimitExceeded(), HEALTHY, True, "event"),
    (errors.StringDataRightTruncation(), HEALTHY, False, "event"),
    (errors.UntranslatableCharacter(), HEALTHY, True, "event"),
    (errors.UniqueViolation(), HEALTHY, False, "event"),
    (errors.RaiseException(), HEALTHY, False, "event"),
    (errors.InternalError_(), HEALTHY, False, "event"),
    (ValueError("not a database error"), HEALTHY, True, "event"),
]


@pytest.mark.parametrize(
    ("error", "conn", "own", "expected"),
    CASES,
    ids=[f"{type(c[0]).__name__}-{i}" for i, c in enumerate(CASES)],
)
def test_one_classification_from_the_evidence(
    error: BaseException, conn: Conn | None, own: bool, expected: Blame
) -> None:
    assert blame(error, conn, own=own) == expected
    translated = translate(error, conn, own=own)
    assert translated.transient is (expected != "event")
    assert isinstance(translated, ConflictError) is (expected == "conflict")


@pytest.mark.parametrize(
    ("error", "conn", "expected"),
    [(e, c, b) for e, c, own, b in CASES if c is not None and not own and b != "wait"],
    ids=lambda v: type(v).__name__,
)
def test_what_a_handler_raised_is_judged_the_same_also_wrapped(
    error: BaseException, conn: Conn, expected: Blame
) -> None:
    wrapped = RuntimeError("the handler wrapped it")
    wrapped.__cause__ = error
    for raised in (error, wrapped):
        found = behind(raised, conn)
        if expected == "event":
            assert found is None, raised
        else:
            assert found is not None and found.transient, raised
            assert isinstance(found, ConflictError) is (expected == "conflict")


def test_a_store_error_over_a_psycopg_error_is_judged_again_on_the_evidence() -> None:
    # Given what an outbox enqueue raised inside a handler, after the handler
    # swallowed an earlier error: PipelineAborted, called transient by its writer
    aborted = errors.PipelineAborted("pipeline aborted")
    enqueue = StoreError("cannot enqueue event", transient=True)
    enqueue.__cause__ = aborted
    # Then, on a healthy connection, it is the event's; on a lost one, an outage
    assert behind(enqueue, HEALTHY) is None
    lost = behind(enqueue, LOST)
    assert lost is not None and lost.transient
    # A StoreError kinbox raised on its own evidence is trusted as it is
    assert behind(StoreError("lost", transient=True), HEALTHY) is not None
    assert behind(StoreError("left aborted", transient=False), HEALTHY) is None
