"""The console's Starlette application: routes, templates, and the headers every answer carries.

Why a page cannot run what a dead letter holds, even if it tried:

- every value a template prints is escaped (Jinja's autoescaping, on for
  every template) after secrets are masked in it (``finalize``, see
  :mod:`kinbox.console.redact`);
- every answer carries a Content-Security-Policy that allows scripts and
  styles from this console's own ``/static/`` only, no inline script, no
  other origin: a missed escape still could not run anything;
- ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` (the
  login URL holds the token), ``X-Frame-Options: DENY`` and
  ``Cache-Control: no-store`` besides.

The assets (one stylesheet, one small script for the live refresh and the
confirmations) ship in the package, under ``static/``: nothing is fetched
from anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from kinbox.console import actions, formats, pages
from kinbox.console.auth import is_public
from kinbox.console.state import Console

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class AccessGuard(BaseHTTPMiddleware):
    """The token on every path but the public ones, read-only mode, the security headers."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """Refuse, or pass on; either way add :data:`HEADERS`."""
        console: Console = request.app.state.console
        response = self._refusal(request, console)
        if response is None:
            response = await call_next(request)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @staticmethod
    def _refusal(request: Request, console: Console) -> Response | None:
        path = request.url.path
        if is_public(path):
            return None
        who = console.gate.identify(request)
        if who is None:
            if request.method == "GET" and not path.startswith("/api/"):
                return RedirectResponse(f"/login?next={path}", status_code=303)
            return PlainTextResponse("the console's access token is required", status_code=401)
        request.state.who = who
        if request.method == "POST" and path != "/logout" and not console.settings.allow_actions:
            return PlainTextResponse(
                "this console is read-only: start it with --allow-actions to act",
                status_code=403,
            )
        return None


def templates(console: Console) -> Jinja2Templates:
    """The templates: autoescaped, every printed value masked, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kinbox.console", "templates"),
        autoescape=True,
        finalize=console.scrubber.finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ago=formats.ago, moment=formats.moment, since=formats.since, size=formats.format_size
    )
    env.globals.update(settings=console.settings, actions=console.settings.allow_actions)
    return Jinja2Templates(env=env)


def create_app(console: Console, *, sample: bool = True) -> Starlette:
    """The application; with ``sample``, its lifespan runs the sampler in the background."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(console.sampler.run()) if sample else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    routes = [
        Route("/healthz", pages.health),
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", actions.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Route("/", pages.overview),
        Route("/partials/overview", pages.overview_live),
        Route("/api/overview", pages.overview_json),
        Route("/dead-letters", pages.letter_groups),
        Route("/api/dead-letters", pages.letters_json),
        Route("/dead-letters/{fingerprint}", pages.letter_group),
        Route("/parked-keys", pages.parked_keys),
        Route("/events", pages.event),
        Route("/api/events/{event_id:path}", pages.event_json),
        Route("/decisions", pages.decisions),
        Route("/dead-letters/{fingerprint}/{verb}", actions.group, methods=["POST"]),
        Route("/dead-letter/{verb}", actions.record, methods=["POST"]),
        Route("/outbox/rows/{row_id}/{verb}", actions.outbox_row, methods=["POST"]),
        Route("/parked-keys/{verb}", actions.parked_key, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("kinbox.console", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(AccessGuard)], lifespan=lifespan)
    app.state.console = console
    app.state.templates = templates(console)
    return app
