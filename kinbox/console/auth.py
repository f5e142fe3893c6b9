"""Who may see the console and act in it: the access token, sessions, CSRF, read-only mode.

Every path but ``/healthz``, ``/login`` and ``/static/`` needs the token, in
one of two ways:

- a person logs in with it (the login form, or the URL ``kinbox console``
  prints once at start) and gets a session: a random id in an ``HttpOnly``,
  ``SameSite=Strict`` cookie, kept in this process's memory (a restart logs
  everyone out). Each session has its own CSRF token, which every form
  carries and every action checks; with ``SameSite=Strict`` another site's
  page cannot send the cookie along anyway.
- a program sends ``Authorization: Bearer <token>`` on each request (no
  cookie, so no CSRF to fear).

Tokens are compared in constant time (:func:`hmac.compare_digest`). Who acts
is the name given at login, else an ``X-Operator`` header, else the
console's ``--operator``: that name is what ``operator_decisions`` records.

Actions (POST) are refused with 403 unless the console was started with
``--allow-actions``; the pages then show no buttons either.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from starlette.requests import Request

COOKIE = "kinbox_console"
CSRF_FIELD = "csrf"
PUBLIC = ("/healthz", "/login", "/static/")
SESSION_SECONDS = 12 * 3600.0
MAX_SESSIONS = 1000
OPERATOR_CHARS = 80


@dataclass(frozen=True)
class Identity:
    """Who is asking: the operator's name, and the session's CSRF token (``None``: a program)."""

    operator: str
    csrf: str | None
    session: str | None = None


def clean_operator(name: str) -> str:
    """A name fit to record: printable, single-line, at most :data:`OPERATOR_CHARS` characters."""
    kept = "".join(c for c in name if c.isprintable()).strip()
    return kept[:OPERATOR_CHARS]


class Gate:
    """Checks the token, keeps the sessions.

    Args:
        token: the access token.
        operator: the name recorded when nobody says who they are.
    """

    def __init__(self, token: str, operator: str) -> None:
        self._token = token.encode()
        self._operator = operator
        self._sessions: OrderedDict[str, tuple[Identity, float]] = OrderedDict()

    def valid(self, given: str | None) -> bool:
        """Whether ``given`` is the token (in constant time)."""
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def login(self, name: str = "") -> tuple[str, Identity]:
        """Open a session for ``name`` (the console's operator if empty); return its id."""
        session = secrets.token_urlsafe(32)
        who = Identity(clean_operator(name) or self._operator, secrets.token_urlsafe(32), session)
        self._sessions[session] = (who, time.monotonic() + SESSION_SECONDS)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session, who

    def logout(self, session: str | None) -> None:
        """Close a session (nothing if it is unknown)."""
        if session is not None:
            self._sessions.pop(session, None)

    def identify(self, request: Request) -> Identity | None:
        """Who sends ``request``: its session, or its bearer token; ``None`` if neither holds."""
        cookie = request.cookies.get(COOKIE)
        if cookie:
            found = self._sessions.get(cookie)
            if found is not None and found[1] > time.monotonic():
                return found[0]
            self._sessions.pop(cookie, None)
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.valid(given.strip()):
            name = clean_operator(request.headers.get("x-operator", ""))
            return Identity(name or self._operator, None)
        return None

    @staticmethod
    def csrf_ok(who: Identity, given: str | None) -> bool:
        """Whether a form's CSRF token is the session's (a program needs none)."""
        if who.csrf is None:
            return True
        return given is not None and hmac.compare_digest(given.encode(), who.csrf.encode())


def is_public(path: str) -> bool:
    """Whether ``path`` is served without the token."""
    return path in PUBLIC[:2] or path.startswith(PUBLIC[2])


def safe_next(target: str | None) -> str:
    """Where to go after login: a path of this console only, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
