"""What the console's pages share while it runs: settings, the decision log, the scans, the sampler.

The dead letters are read again at most every few seconds
(:meth:`Console.letters`): a page, the sampler and an action asking at once
share one read, and an action always asks for a fresh one, so it acts on
what the topics hold now.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kinbox.console.auth import Gate
from kinbox.console.decide import Actions
from kinbox.console.letters import LetterView, Scan, scan
from kinbox.console.overview import Overview, take
from kinbox.console.parked import ParkedKeySource, source
from kinbox.console.redact import Scrubber
from kinbox.console.sampler import Sampler
from kinbox.console.settings import ConsoleSettings
from kinbox.core.config import Settings
from kinbox.core.publisher import Publisher
from kinbox.store.decisions import DecisionLog

SCAN_REUSE_SECONDS = 3.0
"""A scan younger than this serves a page as it is."""


class Console:
    """The running console's shared state.

    Args:
        settings: the console's settings.
        publisher: creates the producer replays go through.
    """

    def __init__(
        self, settings: ConsoleSettings, publisher: Callable[[Settings], Publisher]
    ) -> None:
        self.settings = settings
        connection = settings.connection
        self.scrubber = Scrubber([*connection.secret_values(), settings.token])
        self.gate = Gate(settings.token, settings.operator)
        self.log = DecisionLog(connection.database_url, connection.schema)
        self.keys: ParkedKeySource = source(connection, publisher)
        self.actions = Actions(connection, self.log, self.keys, publisher, self.scrubber.text)
        self.sampler = Sampler(self.snapshot, settings.sample_every)
        self._scan: Scan | None = None
        self._scanned_at = 0.0
        self._lock = threading.Lock()

    def letters(self, max_age: float = SCAN_REUSE_SECONDS) -> Scan:
        """The dead letters, read now unless a read younger than ``max_age`` seconds exists.

        Blocking (Kafka and PostgreSQL): call it on a worker thread.
        """
        with self._lock:
            if self._scan is None or time.monotonic() - self._scanned_at > max_age:
                s = self.settings
                self._scan = scan(s.connection, s.scan_limit, s.dlq_topics, self.log)
                self._scanned_at = time.monotonic()
            return self._scan

    def forget_letters(self) -> None:
        """Drop the last read, after an action changed what is open."""
        with self._lock:
            self._scan = None

    def snapshot(self) -> Overview:
        """A fresh overview (blocking): the sampler's job."""
        return take(self.settings.connection, self.settings.sample_every, self.letters)

    def letter(self, topic: str, partition: int, offset: int) -> LetterView | None:
        """The dead letter at those coordinates in a fresh read, if it is among those read."""
        return self.letters(max_age=0).find(topic, partition, offset)
