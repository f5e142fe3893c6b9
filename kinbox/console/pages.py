"""The console's pages (GET): overview, dead letters, parked keys, an event's story, decisions.

Each handler gathers its data on a worker thread (Kafka and PostgreSQL are
read with blocking clients) and renders a template; the ``/api/`` twins
answer the same data as JSON for scripts.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from kinbox.console import preview
from kinbox.console.app_support import console_of, json_of, render
from kinbox.console.charts import chart, chart_span
from kinbox.console.fingerprint import is_fingerprint
from kinbox.console.letters import LetterGroup, LetterView, Scan
from kinbox.console.overview import Overview
from kinbox.core.errors import KinboxError
from kinbox.ops.explanation import explain

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


async def health(_request: Request) -> Response:
    """``/healthz``: the process answers (no token needed, nothing told)."""
    return PlainTextResponse("ok")


async def login_form(request: Request) -> Response:
    """The login form; ``?token=`` (the URL printed at start) logs in at once."""
    from kinbox.console.actions import start_session

    console = console_of(request)
    token = request.query_params.get("token")
    if token is not None and console.gate.valid(token):
        return start_session(request, "", "/")
    error = "That token is not this console's." if token is not None else None
    return await render(
        request, "login.html", status_code=401 if error else 200,
        error=error, next=request.query_params.get("next", "/"),
    )  # fmt: skip


async def _snapshot(request: Request) -> Overview:
    sampler = console_of(request).sampler
    return sampler.latest or await sampler.sample()


def _charts(request: Request) -> list[Any]:
    series = console_of(request).sampler.series()
    now = time.time()
    span = chart_span(now - series[0].at if series else 0.0)
    return [
        chart("Lag", "records behind, all groups", [(s.at, s.lag) for s in series], now, span),
        chart("Throughput", "events applied / s", [(s.at, s.applied) for s in series], now, span),
        chart("Dead letters", "dead-lettered / s", [(s.at, s.dead) for s in series], now, span),
    ]


async def overview(request: Request) -> Response:
    """``/``: groups, lag, dead letters by topic, the outbox, slots, and the hour's charts."""
    snap = await _snapshot(request)
    return await render(request, "overview.html", snap=snap, charts=_charts(request))


async def overview_live(request: Request) -> Response:
    """The overview's live part, fetched again every few seconds by ``static/console.js``."""
    snap = await _snapshot(request)
    return await render(request, "_overview_live.html", snap=snap, charts=_charts(request))


async def overview_json(request: Request) -> Response:
    """``/api/overview``: the newest snapshot and the hour's samples."""
    snap = await _snapshot(request)
    body = {
        "at": snap.at.isoformat(),
        "status": None if snap.status is None else snap.status.as_dict(),
        "dead_letter_topics": [vars(t) for t in snap.letters],
        "open_dead_letters": snap.open_letters,
        "errors": snap.errors,
        "samples": [vars(s) for s in console_of(request).sampler.series()],
    }
    return json_of(request, body)


async def _scan(request: Request) -> Scan | Response:
    try:
        return await asyncio.to_thread(console_of(request).letters)
    except KinboxError as exc:
        return await render(request, "error.html", status_code=503, message=f"dead letters: {exc}")


async def letter_groups(request: Request) -> Response:
    """``/dead-letters``: the groups by cause, with counts and first and last seen."""
    scan = await _scan(request)
    if isinstance(scan, Response):
        return scan
    every = request.query_params.get("show") == "all"
    groups = [g for g in scan.groups if every or g.open]
    return await render(request, "letters.html", scan=scan, groups=groups, every=every)


async def letters_json(request: Request) -> Response:
    """``/api/dead-letters``: the groups as JSON."""
    scan = await _scan(request)
    if isinstance(scan, Response):
        return scan
    body = {
        "read_at": scan.read_at.isoformat(),
        "scan_limit": scan.limit,
        "topics": [vars(t) for t in scan.topics],
        "groups": [_group_json(g) for g in scan.groups],
    }
    return json_of(request, body)


def _group_json(group: LetterGroup) -> dict[str, Any]:
    return {
        "fingerprint": group.fingerprint,
        **vars(group.cause),
        "open": len(group.open),
        "read": len(group.letters),
        "first_seen": group.first_seen,
        "last_seen": group.last_seen,
        "topics": group.topics,
        "message": group.message,
    }


async def letter_group(request: Request) -> Response:
    """``/dead-letters/<fingerprint>``: one cause, and samples with headers and payload."""
    fingerprint = request.path_params["fingerprint"]
    if not is_fingerprint(fingerprint):
        return await render(request, "error.html", status_code=404, message="no such group")
    scan = await _scan(request)
    if isinstance(scan, Response):
        return scan
    group = scan.group(fingerprint)
    if group is None:
        return await render(
            request, "error.html", status_code=404,
            message="No dead letter of this cause is among those read now.",
        )  # fmt: skip
    every = request.query_params.get("show") == "all"
    shown = (group.letters if every else group.open)[
        : console_of(request).settings.samples_per_group
    ]
    samples = [_sample(letter) for letter in shown]
    return await render(request, "group.html", group=group, samples=samples, every=every)


def _sample(letter: LetterView) -> dict[str, Any]:
    r = letter.record
    return {
        "letter": letter,
        "key": preview.value_text(r.key) if r.key is not None else None,
        "headers": preview.headers(r.headers),
        "payload": preview.payload(r.value),
    }


async def parked_keys(request: Request) -> Response:
    """``/parked-keys``: keys of the inbox whose events wait behind a dead letter."""
    keys = await asyncio.to_thread(console_of(request).keys.read, 200)
    return await render(request, "parked.html", parked=keys)


async def event(request: Request) -> Response:
    """``/events?id=``: what ``kinbox explain`` says of an event, and its dead letters read."""
    console = console_of(request)
    event_id = request.query_params.get("id", "").strip()
    page: dict[str, Any] = {
        "event_id": event_id, "found": None, "letters": [], "error": None,
        "trace_link": _trace_link(console.settings.trace_url),
    }  # fmt: skip
    if not event_id:
        return await render(request, "event.html", **page)
    try:
        page["found"] = await asyncio.to_thread(explain, console.settings.connection, event_id)
    except KinboxError as exc:
        return await render(request, "event.html", status_code=503, **{**page, "error": str(exc)})
    scan = await _scan(request)
    if not isinstance(scan, Response):
        page["letters"] = [x for g in scan.groups for x in g.letters if x.event_id == event_id]
    return await render(request, "event.html", **page)


def _trace_link(template: str | None) -> Any:
    def link(trace_id: str | None) -> str | None:
        if template is None or trace_id is None or not _TRACE_ID.fullmatch(trace_id):
            return None
        return template.replace("{trace_id}", trace_id)

    return link


async def event_json(request: Request) -> Response:
    """``/api/events/<id>``: ``kinbox explain --json``."""
    console = console_of(request)
    found = await asyncio.to_thread(
        explain, console.settings.connection, request.path_params["event_id"]
    )
    return json_of(request, found.as_dict(), status_code=200 if found.found else 404)


async def decisions(request: Request) -> Response:
    """``/decisions``: who decided what, and when."""
    log = console_of(request).log
    if not await asyncio.to_thread(log.available):
        return await render(request, "decisions.html", rows=[], available=False)
    rows = await asyncio.to_thread(log.recent, 200)
    return await render(request, "decisions.html", rows=rows, available=True)


def redirect(path: str) -> Response:
    """See other: after a form, back to a page (``path`` is always one of ours)."""
    return RedirectResponse(path, status_code=303)
