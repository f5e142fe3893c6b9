"""librdkafka's statistics, read for what kinbox needs: each assigned partition's lag.

With ``statistics.interval.ms`` set, librdkafka hands the application a JSON
document of its internal counters at that interval, from inside ``poll()``
(so on the polling thread, between batches: never on the hot path). Per
partition it has ``consumer_lag``: the high watermark (the last stable
offset under ``isolation.level=read_committed``) minus the committed offset,
or -1 while either is unknown. kinbox commits offsets itself and
synchronously, and librdkafka updates ``committed_offset`` from each
commit's answer, so the figure follows kinbox's commits.

A partition counts when the application has it assigned (``desired``); the
pseudo-partition -1 and partitions of other members are left out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from kinbox.core.lag import Lags

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 10_000
"""How often librdkafka reports, unless ``-X statistics.interval.ms`` says otherwise (0: never)."""


def lags(document: str) -> dict[tuple[str, int], int]:
    """The lag of each assigned partition in librdkafka's statistics ``document``.

    Partitions whose lag is unknown (-1: nothing committed yet, or no fetch
    answer yet) are left out rather than reported as 0.

    Raises:
        ValueError: ``document`` is not JSON.
    """
    stats: Any = json.loads(document)
    found: dict[tuple[str, int], int] = {}
    for topic, about in (stats.get("topics") or {}).items():
        for part in (about.get("partitions") or {}).values():
            partition = part.get("partition", -1)
            lag = part.get("consumer_lag", -1)
            if partition >= 0 and part.get("desired") and lag >= 0:
                found[(topic, partition)] = lag
    return found


def on_stats(update: Callable[[Lags], None]) -> Callable[[str], None]:
    """A ``stats_cb`` for the consumer that hands each report's lags to ``update``.

    A report that cannot be read is logged and skipped: statistics must
    never break the poll that delivers them.
    """

    def receive(document: str) -> None:
        try:
            update(lags(document))
        except (ValueError, TypeError, AttributeError) as exc:
            log.debug("librdkafka statistics not understood (ignored): %s", exc)

    return receive
