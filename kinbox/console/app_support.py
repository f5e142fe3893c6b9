"""What the pages and the actions share: the console of a request, rendering, JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kinbox.console.auth import CSRF_FIELD, Identity
from kinbox.console.state import Console
from kinbox.core.errors import KinboxError


def console_of(request: Request) -> Console:
    """The running console."""
    console: Console = request.app.state.console
    return console


def who(request: Request) -> Identity | None:
    """Who sent ``request`` (``None`` on the public pages)."""
    return getattr(request.state, "who", None)


async def render(
    request: Request, name: str, *, status_code: int = 200, **context: Any
) -> Response:
    """Render template ``name``; ``?decision=N`` (after an action) shows that decision on top."""
    console = console_of(request)
    flash = None
    decision = request.query_params.get("decision", "")
    if decision.isdigit() and who(request) is not None:
        try:
            flash = await asyncio.to_thread(console.log.get, int(decision))
        except KinboxError:
            flash = None
    page: dict[str, Any] = {
        "who": who(request),
        "csrf_field": CSRF_FIELD,
        "flash": flash,
        "path": request.url.path,
        "database": console.scrubber.text(console.settings.connection.database_url),
        "schema": console.settings.connection.schema,
        **context,
    }
    templates = request.app.state.templates
    response: Response = templates.TemplateResponse(request, name, page, status_code=status_code)
    return response


class SafeJSON(Response):
    """JSON with every secret masked, whatever the data held."""

    media_type = "application/json"

    def __init__(self, content: Any, scrub: Callable[[str], str], status_code: int = 200) -> None:
        super().__init__(scrub(json.dumps(content, default=str)), status_code)


def json_of(request: Request, body: Any, status_code: int = 200) -> Response:
    """``body`` as JSON, secrets masked."""
    return SafeJSON(body, console_of(request).scrubber.text, status_code)
