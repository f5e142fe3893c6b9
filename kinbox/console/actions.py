"""The console's forms (POST): log in and out, and the actions on dead letters, rows and keys.

Every action checks the form's CSRF token against the session's (programs
sending the bearer token need none), runs on a worker thread through
:class:`kinbox.console.decide.Actions`, and answers a person with a
redirect back to the page (``?decision=N`` shows what happened) and a
program with JSON. Read-only mode never gets here: the guard in
:mod:`kinbox.console.app` refuses every POST but ``/logout`` first.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from kinbox.console.app_support import console_of, json_of, render, who
from kinbox.console.auth import COOKIE, CSRF_FIELD, Gate, Identity, safe_next
from kinbox.console.decide import ActionResult
from kinbox.console.fingerprint import is_fingerprint
from kinbox.core.errors import KinboxError

VERBS = ("replay", "discard")
ROW_VERBS = ("requeue", "discard")
KEY_VERBS = ("release", "discard")


def start_session(request: Request, name: str, target: str) -> Response:
    """Open a session and go to ``target`` with its cookie set."""
    session, _ = console_of(request).gate.login(name)
    response = RedirectResponse(safe_next(target), status_code=303)
    response.set_cookie(
        COOKIE, session, httponly=True, samesite="strict", path="/",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


async def login(request: Request) -> Response:
    """The login form: the token (and a name to act under) opens a session."""
    form = await request.form()
    token, name, target = (str(form.get(k, "")) for k in ("token", "name", "next"))
    if not console_of(request).gate.valid(token):
        return await render(
            request, "login.html", status_code=401, error="That token is not this console's.",
            next=safe_next(target),
        )  # fmt: skip
    return start_session(request, name, target)


async def logout(request: Request) -> Response:
    """Close the session."""
    form = await request.form()
    person = who(request)
    if person is not None and Gate.csrf_ok(person, _field(form, CSRF_FIELD)):
        console_of(request).gate.logout(person.session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


async def group(request: Request) -> Response:
    """Replay or discard the open dead letters of one cause."""
    fingerprint, verb = request.path_params["fingerprint"], request.path_params["verb"]
    if not is_fingerprint(fingerprint):
        return await _refuse(request, 404, "no such group")
    person, refusal = await _checked(request, VERBS)
    if person is None:
        return refusal
    console = console_of(request)
    console.forget_letters()
    scan = await asyncio.to_thread(console.letters, 0)
    found = scan.group(fingerprint)
    if found is None or not found.open:
        return await _refuse(request, 409, "no open dead letter of this cause is left")
    act = console.actions.replay if verb == "replay" else console.actions.discard
    outcome = await _run(
        request, act, person.operator, found.open, "dead-letter group", fingerprint
    )
    if isinstance(outcome, Response):
        return outcome
    return _done(request, person, outcome, f"/dead-letters/{fingerprint}")


async def record(request: Request) -> Response:
    """Replay or discard one dead letter, named by its coordinates in the form."""
    verb = request.path_params["verb"]
    person, refusal = await _checked(request, VERBS)
    if person is None:
        return refusal
    form = await request.form()
    try:
        topic = str(form["topic"])
        partition, offset = int(str(form["partition"])), int(str(form["offset"]))
    except (KeyError, ValueError):
        return await _refuse(request, 400, "topic, partition and offset are needed")
    console = console_of(request)
    letter = await asyncio.to_thread(console.letter, topic, partition, offset)
    if letter is None:
        return await _refuse(
            request, 404, f"{topic}[{partition}]@{offset} is not among the dead letters read"
        )
    if letter.closed is not None:
        return await _refuse(request, 409, f"{topic}[{partition}]@{offset} was dealt with already")
    act = console.actions.replay if verb == "replay" else console.actions.discard
    subject = f"{topic}[{partition}]@{offset}"
    outcome = await _run(request, act, person.operator, [letter], "dead letter", subject)
    if isinstance(outcome, Response):
        return outcome
    back = _field(form, "back") or f"/dead-letters/{letter.cause.fingerprint}"
    return _done(request, person, outcome, back)


async def outbox_row(request: Request) -> Response:
    """Requeue or discard one parked outbox row."""
    verb = request.path_params["verb"]
    try:
        row_id = uuid.UUID(request.path_params["row_id"])
    except ValueError:
        return await _refuse(request, 404, "no such row")
    person, refusal = await _checked(request, ROW_VERBS)
    if person is None:
        return refusal
    actions = console_of(request).actions
    act = actions.requeue_row if verb == "requeue" else actions.discard_row
    outcome = await _run(request, act, person.operator, row_id)
    if isinstance(outcome, Response):
        return outcome
    return _done(request, person, outcome, "/")


async def parked_key(request: Request) -> Response:
    """Release or discard one parked key of the inbox."""
    verb = request.path_params["verb"]
    person, refusal = await _checked(request, KEY_VERBS)
    if person is None:
        return refusal
    form = await request.form()
    group_id, topic, key = (_field(form, k) or "" for k in ("group", "topic", "key"))
    actions = console_of(request).actions
    act = actions.release_key if verb == "release" else actions.discard_key
    outcome = await _run(request, act, person.operator, group_id, topic, key)
    if isinstance(outcome, Response):
        return outcome
    return _done(request, person, outcome, "/parked-keys")


async def _checked(request: Request, verbs: tuple[str, ...]) -> tuple[Identity | None, Response]:
    """The person acting, once the verb is known and the CSRF token theirs; else the refusal."""
    if request.path_params["verb"] not in verbs:
        return None, await _refuse(request, 404, "no such action")
    person = who(request)
    form = await request.form()
    if person is None or not Gate.csrf_ok(person, _field(form, CSRF_FIELD)):
        return None, await _refuse(request, 403, "the form is stale or not this console's: reload")
    return person, Response()


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return None if value is None else str(value)


def _done(request: Request, person: Identity, outcome: ActionResult, back: str) -> Response:
    # What is open has changed: the next page reads the topics and decisions afresh.
    console_of(request).forget_letters()
    console_of(request).sampler.refresh()
    if person.csrf is None:  # a program: the outcome itself
        body = {"decision": outcome.decision, "ok": outcome.ok, "message": outcome.message}
        return json_of(request, body, status_code=200 if outcome.ok else 502)
    target = safe_next(back).split("?")[0]
    return RedirectResponse(f"{target}?{urlencode({'decision': outcome.decision})}", 303)


async def _refuse(request: Request, status: int, message: str) -> Response:
    if getattr(request.state, "who", None) is not None and request.state.who.csrf is None:
        return json_of(request, {"ok": False, "message": message}, status_code=status)
    return await render(request, "error.html", status_code=status, message=message)


async def _run(request: Request, act: Any, *args: Any) -> ActionResult | Response:
    """Run an action on a worker thread; a decision that cannot be recorded is a refusal."""
    try:
        outcome: ActionResult = await asyncio.to_thread(act, *args)
    except KinboxError as exc:
        return await _refuse(
            request, 503, f"nothing was done: the decision cannot be recorded: {exc}"
        )
    return outcome
