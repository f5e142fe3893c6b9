"""kinbox console in a real Chromium, against a real broker, database and worker.

The dead letters were made by a real ``kinbox worker`` run (see
:mod:`tests.console.support`): four causes, one record without an event id.
The order of the tests matters only in what they leave: each acts on a cause
or a row of its own.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from playwright.sync_api import Browser, Page, expect
from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.kafka.inspect import Inspector
from tests.console.conftest import OPERATOR, TRACE_URL, logged_in
from tests.console.support import (
    PASSWORD,
    TRACE_ID,
    ConsoleProcess,
    DeadLetters,
    park_outbox_row,
    produce,
)
from tests.support.waiting import wait_for

Answer = tuple[int, dict[str, str], str]

REPLAYS = """
SELECT operator, action, target, subject, records, outcome
FROM {schema}.operator_decisions WHERE action = 'replay'
"""
EFFECTS = """
SELECT event_id, count(*) FROM {schema}.console_effects
WHERE event_id = ANY(%s) GROUP BY event_id
"""
DISCARDS = """
SELECT d.operator, d.target, d.subject, d.records, d.outcome,
       r.dlq_topic || '[' || r.partition || ']@' || r."offset"
FROM {schema}.operator_decisions d
JOIN {schema}.operator_decision_records r ON r.decision_id = d.id
WHERE d.action = 'discard'
"""


def http(
    url: str, *, token: str | None = None, method: str = "GET", data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:  # fmt: skip
    """A plain HTTP request (no browser, no redirects followed): status, headers, body."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with opener.open(request, timeout=60) as answer:
            return int(answer.status), dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers), exc.read().decode()


def api(running: ConsoleProcess, path: str) -> Any:
    status, _, body = http(running.base + path, token=running.token)
    assert status == 200, body
    return json.loads(body)


def group_of(running: ConsoleProcess, reason: str, error_type: str = "") -> dict[str, Any]:
    groups = api(running, "/api/dead-letters")["groups"]
    found = [g for g in groups if g["reason"] == reason and error_type in g["error_type"]]
    assert len(found) == 1, groups
    return dict(found[0])


def rows(stack: Stack, query: str, schema: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        formatted = sql.SQL(query).format(schema=sql.Identifier(schema))
        return conn.execute(formatted, params).fetchall()


def test_the_token_is_required(browser: Browser, console: ConsoleProcess) -> None:
    # A page without the token goes to the login form; a wrong token is refused
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{console.base}/dead-letters")
    assert page.url.startswith(f"{console.base}/login")
    page.fill("#token", "not-the-token-at-all")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("not this console's")
    page.goto(f"{console.base}/login?token=wrong-token-also-wrong")
    expect(page.locator("#login-error")).to_be_visible()
    # The URL the console printed logs in, and sets an HttpOnly SameSite=Strict cookie
    page.goto(console.login_url)
    assert page.url == f"{console.base}/"
    [cookie] = context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert console.token not in cookie["value"]
    context.close()
    # Programs: the bearer token, or nothing but /healthz
    assert http(f"{console.base}/healthz")[0] == 200
    for path in ("/api/overview", "/api/dead-letters", "/api/events/x"):
        assert http(console.base + path)[0] == 401
        assert http(console.base + path, token="wrong-token-wrong-token")[0] == 401
    assert http(f"{console.base}/")[0] == 303
    assert http(f"{console.base}/api/dead-letters", token=console.token)[0] == 200
    status, _, _ = http(
        f"{console.base}/dead-letter/discard", method="POST", data=b"topic=t&partition=0&offset=0"
    )
    assert status == 401


def test_every_page_shows_the_real_dead_letters(
    page: Page, console: ConsoleProcess, made: DeadLetters
) -> None:
    # Overview: the group with its partitions, the dead-letter topic with its
    # 8 open dead letters, no lag, charts; refreshed live by the page's script
    expect(page.locator("#groups")).to_contain_text(made.group)
    expect(page.locator("#groups")).to_contain_text("Stable")
    expect(page.locator("#dead-letter-topics")).to_contain_text(made.dlq)
    expect(page.locator("#open-letters")).to_have_text("8")
    expect(page.locator("#lag")).to_have_text("0")
    expect(page.locator(".chart")).to_have_count(3)
    expect(page.locator("#live")).to_have_attribute("data-refreshed", re.compile(r"\d{4}-"))
    expect(page.locator("#operator")).to_have_text(OPERATOR)
    expect(page.locator("#mode")).to_have_text("actions allowed")

    # Dead letters, grouped by cause: counts per group
    page.get_by_role("link", name="Dead letters", exact=True).click()
    table = page.locator("#letter-groups")
    expect(table.locator("tr.group")).to_have_count(5)
    counts = [
        (row.locator("a.cause").inner_text(), int(row.locator(".count").inner_text()))
        for row in table.locator("tr.group").all()
    ]
    assert ("dead-letter-requested: customer <n> unknown", 3) in counts
    assert ("handler-error", 2) in counts and ("invalid-id", 1) in counts
    assert sorted(n for _, n in counts) == [1, 1, 1, 2, 3]

    # A group: samples with their headers and a payload preview
    page.get_by_role("link", name="dead-letter-requested: customer <n> unknown").click()
    expect(page.locator("#open-count")).to_have_text("3")
    letters = page.locator(".letter")
    expect(letters).to_have_count(3)
    first = letters.first
    expect(first.locator(".headers")).to_contain_text("kinbox.dlq.reason")
    expect(first.locator(".headers")).to_contain_text(made.group)
    expect(first.locator("pre.payload")).to_contain_text('"kind": "refuse"')
    expect(first).to_contain_text("dead-lettered")

    # An event's story, from a sample's event id: its verdict and its trace, linked
    event_id = made.ids["refuse"][0]
    page.goto(f"{console.base}/events?id={event_id}")
    expect(page.locator("#processed")).to_contain_text("dead-lettered")
    expect(page.locator("#processed")).to_contain_text("customer 17 unknown")
    link = page.locator("#processed a.trace")
    expect(link).to_have_attribute("href", TRACE_URL.replace("{trace_id}", TRACE_ID))
    expect(page.locator("#event-letters")).to_contain_text(made.dlq)
    page.fill("#event-id", "no-such-event")
    page.get_by_role("button", name="Explain").click()
    expect(page.locator("#not-found")).to_be_visible()

    # Parked keys: none yet (every key of these events is its own)
    page.get_by_role("link", name="Parked keys").click()
    expect(page.locator("#parked-keys")).to_contain_text("No key is parked.")

    page.get_by_role("link", name="Decisions").click()
    expect(page.locator("h1")).to_have_text("Decisions")


def test_a_dead_letter_holding_html_and_script_is_shown_as_text(
    page: Page, console: ConsoleProcess, made: DeadLetters
) -> None:
    # Given the dead letter whose payload, header and reason hold HTML and script
    hostile = group_of(console, "dead-letter-requested: <b>bold</b><script>window.__pwned = "
                       "'reason'</script>")  # fmt: skip
    page.goto(f"{console.base}/dead-letters/{hostile['fingerprint']}")
    # Then it reads as text, and nothing of it ran or became an element
    expect(page.locator("#cause")).to_contain_text("<script>window.__pwned = 'reason'</script>")
    expect(page.locator("pre.payload")).to_contain_text("<img src=x onerror=")
    expect(page.locator(".headers")).to_contain_text("<script>window.__pwned = 'header'</script>")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("main script, main img, main b").count() == 0
    scripts = page.evaluate("Array.from(document.scripts).map(s => s.src)")
    assert scripts == [f"{console.base}/static/console.js"]
    # ... and a missed escape could not run inline script either
    _, headers, _ = http(f"{console.base}/dead-letters", token=console.token)
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy


def test_no_page_json_or_log_line_shows_the_database_password(
    page: Page, console: ConsoleProcess, made: DeadLetters
) -> None:
    # Given a console given a database URL with a password, and a dead letter
    # whose error message quotes that URL (the handler leaked it)
    leak = group_of(console, "handler-error", "RuntimeError")
    shown = []
    paths = ["/", "/dead-letters", "/dead-letters?show=all", "/parked-keys", "/decisions",
             f"/dead-letters/{leak['fingerprint']}", f"/events?id={made.ids['leak'][0]}",
             "/partials/overview"]  # fmt: skip
    for path in paths:
        page.goto(console.base + path)
        shown.append(page.content())
    for path in ["/api/overview", "/api/dead-letters", f"/api/events/{made.ids['leak'][0]}"]:
        shown.append(http(console.base + path, token=console.token)[2])
    # Then the password is nowhere, masked where the URL is quoted
    assert all(PASSWORD not in text for text in shown)
    assert any("postgres:***@" in text for text in shown)
    assert PASSWORD not in console.log()


def test_a_replay_republishes_and_the_worker_applies_each_event_once(
    page: Page, console: ConsoleProcess, made: DeadLetters, stack: Stack
) -> None:
    # Given the handler is fixed (the failing case is gone)
    made.broken.unlink()
    poison = group_of(console, "handler-error", "ValueError")
    ends_before = _ends(stack, made.dlq, made.topic)
    # When the operator replays the group from its page
    page.goto(f"{console.base}/dead-letters/{poison['fingerprint']}")
    page.get_by_role("button", name="Replay all 2").click()
    # Then the console says so, and records who, when and what
    expect(page.locator("#flash")).to_contain_text("replayed 2 dead letter(s)")
    [decision] = rows(stack, REPLAYS, made.schema)
    assert decision == (OPERATOR, "replay", "dead-letter group", poison["fingerprint"], 2, "done")
    covered = rows(stack, "SELECT event_id FROM {schema}.operator_decision_records r JOIN"
                   " {schema}.operator_decisions d ON d.id = r.decision_id"
                   " WHERE d.action = 'replay'", made.schema)  # fmt: skip
    assert sorted(r[0] for r in covered) == sorted(made.ids["poison"])
    # ... the records really went back to their topic, and the worker applied each once
    ends_after = _ends(stack, made.dlq, made.topic)
    assert ends_after[made.topic] == ends_before[made.topic] + 2

    def applied() -> bool:
        found = rows(stack, "SELECT event_id, status FROM {schema}.processed_events"
                     " WHERE event_id = ANY(%s)", made.schema, made.ids["poison"])  # fmt: skip
        return sorted(s for _, s in found) == ["applied", "applied"]

    wait_for(applied, 60, "the replayed events applied")
    effects = rows(stack, EFFECTS, made.schema, made.ids["poison"])
    assert sorted(effects) == sorted((i, 1) for i in made.ids["poison"])
    assert ends_after[made.dlq] == _ends(stack, made.dlq, made.topic)[made.dlq]  # none failed again
    # ... and the group is no longer open; its letters show their new verdict
    page.goto(f"{console.base}/dead-letters")
    expect(page.locator(f"tr[data-fingerprint='{poison['fingerprint']}']")).to_have_count(0)
    page.goto(f"{console.base}/dead-letters/{poison['fingerprint']}?show=all")
    expect(page.locator(".letter .badge.good")).to_have_count(2)  # applied
    expect(page.locator("#open-count")).to_have_text("0")


def test_a_discard_is_recorded_and_the_letter_is_no_longer_open(
    page: Page, console: ConsoleProcess, made: DeadLetters, stack: Stack
) -> None:
    refuse = group_of(console, "dead-letter-requested: customer <n> unknown")
    kept = _ends(stack, made.dlq, made.topic)[made.dlq]
    page.goto(f"{console.base}/dead-letters/{refuse['fingerprint']}")
    letter = page.locator(".letter").first
    where = letter.locator(".where").inner_text()
    letter.locator("button:has-text('Discard')").click()
    expect(page.locator("#flash")).to_contain_text("discarded 1 dead letter(s)")
    expect(page.locator("#open-count")).to_have_text("2")
    [decision] = rows(stack, DISCARDS, made.schema)
    assert decision == (OPERATOR, "dead letter", where, 1, "done", where)
    assert group_of(console, "dead-letter-requested: customer <n> unknown")["open"] == 2
    assert _ends(stack, made.dlq, made.topic)[made.dlq] == kept  # it stays in Kafka
    # The decisions page lists it
    page.goto(f"{console.base}/decisions")
    expect(page.locator("tr.decision[data-action='discard']")).to_contain_text(OPERATOR)
    # Acting on it again is refused: it was dealt with
    status, _, body = http(
        f"{console.base}/dead-letter/replay", token=console.token, method="POST",
        data=_form(where), headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert status == 409, body


def test_a_form_from_elsewhere_is_refused(page: Page, console: ConsoleProcess) -> None:
    # The session's cookie alone is not enough: the form must carry its CSRF token
    answer = page.request.post(
        f"{console.base}/dead-letter/discard",
        form={"topic": "t", "partition": "0", "offset": "0", "csrf": "forged"},
        max_redirects=0,
    )
    assert answer.status == 403


def test_a_parked_outbox_row_can_be_requeued_or_discarded(
    page: Page, console: ConsoleProcess, made: DeadLetters, stack: Stack
) -> None:
    first = park_outbox_row(stack.database_url, made.schema, "order-17")
    second = park_outbox_row(stack.database_url, made.schema, "order-18")
    page.goto(f"{console.base}/")
    expect(page.locator("#outbox")).to_contain_text(first)
    page.locator(f"form[action='/outbox/rows/{first}/requeue'] button").click()
    expect(page.locator("#flash")).to_contain_text("requeued")
    page.locator(f"form[action='/outbox/rows/{second}/discard'] button").click()
    expect(page.locator("#flash")).to_contain_text("deleted the parked row")
    statuses = dict(rows(stack, "SELECT id::text, status FROM {schema}.outbox WHERE id::text"
                         " = ANY(%s)", made.schema, [first, second]))  # fmt: skip
    assert statuses == {first: "pending"}
    done = rows(stack, "SELECT action, subject, outcome FROM {schema}.operator_decisions"
                " WHERE target = 'outbox row' ORDER BY id", made.schema)  # fmt: skip
    assert done == [("requeue", first, "done"), ("discard", second, "done")]


def test_a_parked_key_is_listed_then_released_in_order_or_discarded(
    page: Page, console: ConsoleProcess, made: DeadLetters, stack: Stack
) -> None:
    # Given two keys each held behind a dead letter, two events waiting on each
    hold = Path(f"{made.broken}.hold")
    hold.touch()
    batch: list[dict[str, Any]] = [
        {"kind": "hold"},
        {"kind": "good", "n": 10},
        {"kind": "good", "n": 11},
    ]
    kept = produce(stack.bootstrap_servers, made.topic, batch, key=b"acct-1")
    given_up = produce(stack.bootstrap_servers, made.topic, batch, key=b"acct-2")
    waiting = "SELECT key, count(*) FROM {schema}.parked_events GROUP BY key ORDER BY key"
    wait_for(
        lambda: rows(stack, waiting, made.schema) == [(b"acct-1", 2), (b"acct-2", 2)],
        60, "two keys with two parked events each",
    )  # fmt: skip
    hold.unlink()  # the fix is deployed
    # When the on-call sees them, releases acct-1 and discards acct-2
    page.goto(f"{console.base}/parked-keys")
    table = page.locator("#parked-keys")
    expect(table).to_contain_text("acct-1")
    expect(table.locator("tr", has_text="acct-2").locator(".num")).to_have_text("2")
    expect(table.locator("tr", has_text="acct-1")).to_contain_text(kept[0])
    table.locator("tr", has_text="acct-1").get_by_role("button", name="Release").click()
    expect(page.locator("#flash")).to_contain_text("released 2 parked event(s)")
    table.locator("tr", has_text="acct-2").get_by_role("button", name="Discard").click()
    expect(page.locator("#flash")).to_contain_text("discarded 2 parked event(s)")
    # Then acct-1's events are applied once, in order; acct-2's given up; both keys free
    effects = "SELECT event_id FROM {schema}.console_effects WHERE event_id = ANY(%s) ORDER BY seq"
    wait_for(
        lambda: rows(stack, effects, made.schema, kept[1:]) == [(i,) for i in kept[1:]],
        60, "the released events applied",
    )  # fmt: skip
    assert rows(stack, effects, made.schema, given_up) == []
    status = dict(rows(stack, "SELECT event_id, status FROM {schema}.processed_events"
                       " WHERE event_id = ANY(%s)", made.schema, kept + given_up))  # fmt: skip
    assert [status[i] for i in kept] == ["dead_lettered", "applied", "applied"]
    assert [status[i] for i in given_up] == ["dead_lettered", "skipped", "skipped"]
    blocked = "SELECT key FROM {schema}.parked_keys WHERE key = ANY(%s)"
    assert rows(stack, blocked, made.schema, [b"acct-1", b"acct-2"]) == []
    done = rows(stack, "SELECT action, outcome FROM {schema}.operator_decisions"
                " WHERE target = 'parked key' ORDER BY id", made.schema)  # fmt: skip
    assert done == [("release", "done"), ("discard", "done")]


def test_a_read_only_console_shows_no_action_and_refuses_every_one(
    browser: Browser, readonly: ConsoleProcess, made: DeadLetters, stack: Stack
) -> None:
    page = logged_in(browser, readonly)
    expect(page.locator("#mode")).to_have_text("read-only")
    page.goto(f"{readonly.base}/dead-letters")
    expect(page.locator("tr.group").first).to_be_visible()
    assert page.locator("main form button").count() == 0
    refuse = group_of(readonly, "dead-letter-requested: customer <n> unknown")
    before = rows(stack, "SELECT count(*) FROM {schema}.operator_decisions", made.schema)
    # A form post from the page, and a program with the token: both 403, nothing done
    csrf_less = page.request.post(
        f"{readonly.base}/dead-letters/{refuse['fingerprint']}/replay", form={}, max_redirects=0
    )
    assert csrf_less.status == 403
    status, _, body = http(
        f"{readonly.base}/dead-letters/{refuse['fingerprint']}/discard", token=readonly.token,
        method="POST", data=b"",
    )  # fmt: skip
    assert status == 403 and "read-only" in body
    assert rows(stack, "SELECT count(*) FROM {schema}.operator_decisions", made.schema) == before
    page.context.close()


def _ends(stack: Stack, *topics: str) -> dict[str, int]:
    inspector = Inspector({"bootstrap.servers": stack.bootstrap_servers})
    marks = inspector.watermarks(inspector.partitions(topics))
    out = dict.fromkeys(topics, 0)
    for (topic, _), (_, end) in marks.items():
        out[topic] += end
    return out


def _form(where: str) -> bytes:
    found = re.fullmatch(r"(.+)\[(\d+)\]@(\d+)", where)
    assert found is not None
    topic, partition, offset = found.groups()
    return f"topic={topic}&partition={partition}&offset={offset}".encode()
