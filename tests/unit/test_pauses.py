"""The pause ledger: the client's paused set follows what lanes, backoff and breaker want."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.consume.pauses import PauseLedger, Reason
from kinbox.core.errors import TransportError
from kinbox.core.transport import Partition
from kinbox.testing import FakeTransport, record
from tests.unit.test_breaker import failing_app, runner_with

pytestmark = pytest.mark.unit

T = "orders"
PARTITIONS = [(T, p) for p in range(4)]
P0, P1 = PARTITIONS[:2]


class Client:
    """The consumer's pause flags, kept across a revoke (the worst case), refusing on demand."""

    def __init__(self) -> None:
        self.assigned: set[Partition] = set()
        self.paused: set[Partition] = set()
        self.refuse = False

    def pause(self, partitions: Sequence[Partition]) -> None:
        self._check(partitions)
        self.paused.update(partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        self._check(partitions)
        self.paused.difference_update(partitions)

    def _check(self, partitions: Sequence[Partition]) -> None:
        assert set(partitions) <= self.assigned, f"{partitions} not all assigned"
        if self.refuse:
            raise TransportError("refused", retriable=True)


def ledger(assigned: Sequence[Partition] = (P0, P1)) -> tuple[PauseLedger, Client]:
    client = Client()
    pauses = PauseLedger(client)  # type: ignore[arg-type]  # only pause and resume are called
    assign(pauses, client, assigned)
    return pauses, client


def assign(pauses: PauseLedger, client: Client, partitions: Sequence[Partition]) -> None:
    pauses.assign(partitions)  # the callback first, then the client takes them
    client.assigned.update(partitions)


def revoke(pauses: PauseLedger, client: Client, partitions: Sequence[Partition]) -> None:
    pauses.unassign(partitions)  # the callback first, then the client lets them go
    client.assigned.difference_update(partitions)


def wanted(pauses: PauseLedger) -> set[Partition]:
    return {tp for reason in Reason for tp in pauses.holding(reason)}


def test_a_partition_stays_paused_while_any_reason_wants_it() -> None:
    pauses, client = ledger()
    pauses.want(Reason.LANE, [P0])
    pauses.want(Reason.BREAKER, [P0, P1])
    assert client.paused == {P0, P1}
    pauses.release(Reason.BREAKER)  # the breaker lets go while the lane still holds P0
    assert client.paused == {P0}
    pauses.release(Reason.LANE, [P0])
    assert client.paused == set()


def test_a_partition_not_assigned_is_never_paused() -> None:
    pauses, client = ledger(assigned=[P0])
    pauses.want(Reason.BACKOFF, [P1])
    assert client.paused == set() and pauses.holding(Reason.BACKOFF) == set()


def test_a_refused_resume_keeps_it_recorded_paused_until_a_sync_resumes_it() -> None:
    pauses, client = ledger()
    pauses.want(Reason.BACKOFF, [P0])
    client.refuse = True
    with pytest.raises(TransportError):
        pauses.release(Reason.BACKOFF, [P0])
    assert client.paused == pauses.paused == {P0} and not pauses.wanted(P0)
    client.refuse = False
    pauses.sync()
    assert client.paused == pauses.paused == set()


def test_a_refused_pause_is_wanted_still_and_a_sync_pauses_it() -> None:
    pauses, client = ledger()
    client.refuse = True
    with pytest.raises(TransportError):
        pauses.want(Reason.LANE, [P0])
    assert client.paused == pauses.paused == set() and pauses.wanted(P0)
    client.refuse = False
    pauses.sync()
    assert client.paused == pauses.paused == {P0}


def test_a_partition_assigned_again_after_its_resume_was_refused_starts_unpaused() -> None:
    pauses, client = ledger()
    pauses.want(Reason.BREAKER, [P0])
    client.refuse = True
    revoke(pauses, client, [P0])  # logged only: the partition goes either way
    assert client.paused == pauses.paused == {P0} and not pauses.wanted(P0)
    client.refuse = False
    assign(pauses, client, [P0])
    pauses.sync()
    assert client.paused == pauses.paused == set() and not pauses.wanted(P0)


def test_a_partition_no_longer_assigned_is_never_resumed_again() -> None:
    pauses, client = ledger()
    pauses.want(Reason.LANE, [P0])
    client.refuse = True
    revoke(pauses, client, [P0])
    client.refuse = False
    revoke(pauses, client, [P0])  # lost after a revoke: the client has it no more
    pauses.sync()
    assert client.paused == pauses.paused == {P0}  # resumed once it comes back


_reasons = st.sampled_from(list(Reason))
_some = st.lists(st.sampled_from(PARTITIONS), max_size=4, unique=True)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("want"), _reasons, _some),
        st.tuples(st.just("release"), _reasons, st.one_of(st.none(), _some)),
        st.tuples(st.just("assign"), st.just(None), _some),
        st.tuples(st.just("revoke"), st.just(None), _some),
        st.tuples(st.just("refuse"), st.just(None), st.booleans()),
        st.tuples(st.just("sync"), st.just(None), st.none()),
    ),
    max_size=40,
)


Step = tuple[str, Reason | None, object]
"""What to do, for whom, to what: ("want", Reason.LANE, [tp]), ("refuse", None, True), ..."""


def step(
    pauses: PauseLedger, client: Client, kind: str, reason: Reason | None, arg: object
) -> None:
    if kind == "refuse":
        client.refuse = bool(arg)
        return
    try:
        if kind == "want":
            assert reason is not None and isinstance(arg, list)
            pauses.want(reason, arg)
        elif kind == "release":
            assert reason is not None
            pauses.release(reason, arg if isinstance(arg, list) else None)
        elif kind == "assign":
            assert isinstance(arg, list)
            assign(pauses, client, [tp for tp in arg if tp not in client.assigned])
        elif kind == "revoke":
            assert isinstance(arg, list)
            revoke(pauses, client, arg)
        else:
            pauses.sync()
    except TransportError:
        assert client.refuse


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_any_sequence_keeps_the_client_paused_exactly_where_something_wants_it(
    steps: list[Step],
) -> None:
    pauses, client = ledger(assigned=[])
    for kind, reason, arg in steps:
        if kind == "refuse":
            continue  # this client never refuses
        step(pauses, client, kind, reason, arg)
        assert wanted(pauses) <= client.assigned
        assert client.paused & client.assigned == wanted(pauses)
        assert pauses.paused == client.paused


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_with_refusals_the_ledger_knows_the_client_and_a_sync_catches_up(
    steps: list[Step],
) -> None:
    pauses, client = ledger(assigned=[])
    for kind, reason, arg in steps:
        step(pauses, client, kind, reason, arg)
        # Whatever the client refused, the ledger's record of it is the truth
        assert pauses.paused == client.paused
        assert wanted(pauses) <= client.assigned
    client.refuse = False
    pauses.sync()
    assert client.paused & client.assigned == wanted(pauses)
    assert pauses.paused == client.paused


def test_in_the_runner_a_partition_revoked_while_it_backs_off_comes_back_unpaused() -> None:
    transport = FakeTransport({(T, 0): [record(T, 0, 0, "e0")]})
    broken, applied = [True], list[str]()
    runner, _, _, _ = runner_with(transport, failing_app(broken, applied))
    runner.turn()  # the handler fails: the partition backs off, paused
    assert transport.paused == runner._flow.pauses.paused == {(T, 0)}
    transport.revoke([(T, 0)])
    transport.assign([(T, 0)])
    assert not runner._flow.pauses.paused and not runner._flow.pauses.wanted((T, 0))
    broken[0] = False
    runner.turn()  # no backoff left to wait out: read again from the committed offset
    assert applied == ["e0"] and transport.committed == {(T, 0): 1}
