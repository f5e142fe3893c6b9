"""Stage stamps (KINBOX_STAGE_STAMPS): off unless asked, and every stage of every sampled event."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.core.transport import Transport
from kinbox.middleware.base import Middleware
from kinbox.ops import stamps
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, record

pytestmark = pytest.mark.unit

T = "orders"
CONFIG = Settings(database_url="postgresql:///x", group_id="g").validate()


def test_without_the_variable_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stamps.ENV, raising=False)
    transport = FakeTransport()
    added: list[Middleware] = []
    assert stamps.install(transport, added.append) is transport
    assert added == []


@pytest.mark.parametrize("every", ["0", "-3", "many"])
def test_a_sample_that_is_not_a_whole_number_above_zero_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, every: str
) -> None:
    monkeypatch.setenv(stamps.ENV, str(tmp_path / "s"))
    monkeypatch.setenv(stamps.EVERY_ENV, every)
    with pytest.raises(ConfigurationError, match=stamps.EVERY_ENV):
        stamps.install(FakeTransport(), lambda _layer: None)


class _Stopping:
    """Stops the runner once every record is committed (and one more poll has served answers)."""

    def __init__(self, inner: Transport, fake: FakeTransport, runner: list[Runner], n: int) -> None:
        self.inner, self.fake, self.runner, self.n, self.after = inner, fake, runner, n, 2

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        if sum(self.fake.committed.values()) >= self.n:
            self.after -= 1
            if self.after <= 0:
                self.runner[0].stop()
        return self.inner.poll(max_messages, 0.001)


def _run(app: App, path: Path, every: int, records: list[Record]) -> list[list[str]]:
    fake, store = FakeTransport(), FakeStore()
    for r in records:
        fake.append(r)
    taken = stamps.StageStamps(str(path), every)
    app.add_middleware(taken.middleware())
    holder: list[Runner] = []
    wrapped = _Stopping(taken.transport(fake), fake, holder, len(records))
    runner = Runner(app, CONFIG, wrapped, store, FakePublisher())  # type: ignore[arg-type]
    holder.append(runner)
    runner.run()
    assert sorted(store.effects) == sorted(r.offset for r in records)
    return [line.split() for line in path.read_text().splitlines()]


@pytest.mark.parametrize("batch", [False, True], ids=["per-event", "batch"])
def test_every_sampled_event_passes_every_stage_in_order(tmp_path: Path, batch: bool) -> None:
    # Given a worker stamping 1 event in 3, over two partitions
    app = App(group_id="g")

    if batch:

        @app.handler(T, batch=True)
        def apply_all(events: list[Event], tx: Any) -> None:
            tx.effects.extend(e.offset for e in events)

    else:

        @app.handler(T)
        def apply(event: Event, tx: Any) -> None:
            tx.effects.append(event.offset)

    records = [record(T, p, o, f"e{p}-{o}") for p in (0, 1) for o in range(7)]
    # When it applies them
    lines = _run(app, tmp_path / "stamps", 3, records)
    # Then each sampled event (offsets 0, 3, 6) has each stage once, in the stages' order
    seen: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for stage, topic, partition, offset, when in lines:
        assert topic == T and stage in stamps.STAGES
        seen.setdefault((int(partition), int(offset)), []).append((float(when), stage))
    assert set(seen) == {(p, o) for p in (0, 1) for o in (0, 3, 6)}
    for passed in seen.values():
        assert [s for _, s in passed] == list(stamps.STAGES)
        assert [w for w, _ in passed] == sorted(w for w, _ in passed)


def test_blocks_are_written_off_the_polling_thread_and_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given stamps that hand a block over every 4 stamps
    monkeypatch.setattr(stamps, "FLUSH_EVERY", 4)
    path = tmp_path / "stamps"
    taken = stamps.StageStamps(str(path))
    writers: list[str] = []
    write = taken._write

    def noting(rows: list[Any]) -> None:
        writers.append(threading.current_thread().name)
        write(rows)

    monkeypatch.setattr(taken, "_write", noting)
    # When ten are noted, each followed by a poll's hand-off, and the worker stops
    for offset in range(10):
        taken.stamp("fetched", T, 0, offset, float(offset))
        taken.hand_off()
    taken.flush()
    # Then both whole blocks were written by the stamps' own thread, the rest at the stop,
    # and the file holds every stamp once, in the order noted
    me = threading.current_thread().name
    assert len(writers) == 3 and all(w.startswith("kinbox-stamps") for w in writers[:2])
    assert writers[2] == me
    offsets = [int(line.split()[3]) for line in path.read_text().splitlines()]
    assert offsets == list(range(10))


def test_a_block_that_cannot_be_written_is_logged_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(stamps, "FLUSH_EVERY", 2)
    taken = stamps.StageStamps(str(tmp_path / "missing" / "stamps"))
    for offset in range(2):
        taken.stamp("fetched", T, 0, offset, 0.0)
    taken.hand_off()
    taken._writer.shutdown(wait=True)  # type: ignore[union-attr]
    assert "could not write 2 stage stamps" in caplog.text
