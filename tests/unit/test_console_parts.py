"""The console's parts that need no service: causes, previews, charts, secrets, the gate, routes.

The pages against the real stack, in a real browser, are in tests/console.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from typing import Any

import pytest
from starlette.testclient import TestClient

from kinbox.console import charts, preview
from kinbox.console.app import CSP, create_app
from kinbox.console.auth import COOKIE, Gate, safe_next
from kinbox.console.decide import ActionResult
from kinbox.console.fingerprint import LetterCause, cause, is_fingerprint, normalise
from kinbox.console.parked import ParkedKey, ParkedKeys
from kinbox.console.redact import Scrubber
from kinbox.console.settings import ConsoleSettings
from kinbox.console.state import Console
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError
from kinbox.core.record import Record

TOKEN = "t0ken-for-the-unit-tests-0123456789"
URL = "postgresql://op:p%40ss-W0rd-x@db.internal:5432/app"


def letter(reason: str, error_type: str = "ValueError", group: str = "g") -> Record:
    headers = [
        ("event-id", b"e1"), ("kinbox.dlq.topic", b"orders"),
        ("kinbox.dlq.consumer", group.encode()),
        ("kinbox.dlq.reason", reason.encode()), ("kinbox.dlq.error.type", error_type.encode()),
    ]  # fmt: skip
    return Record("orders.dlq", 0, 7, b"k", b"{}", headers, 1_700_000_000_000)


def test_a_cause_ignores_the_data_its_reason_quotes_but_not_its_handler() -> None:
    a = cause(letter("dead-letter-requested: customer 17 unknown"))
    b = cause(letter("dead-letter-requested: customer 4711 unknown"))
    c = cause(letter("dead-letter-requested: customer 17 unknown", group="other"))
    d = cause(letter("dead-letter-requested: customer 17 unknown", error_type="KeyError"))
    assert a is not None and b is not None and c is not None and d is not None
    assert a.reason == "dead-letter-requested: customer <n> unknown"
    assert a.fingerprint == b.fingerprint
    assert len({a.fingerprint, c.fingerprint, d.fingerprint}) == 3
    assert is_fingerprint(a.fingerprint) and not is_fingerprint("../etc")
    # Stable across runs and machines: a hash of the four fields, nothing else
    import hashlib

    expected = hashlib.sha256(b"r\x1fT\x1fg\x1ft").hexdigest()[:16]
    assert LetterCause("r", "T", "g", "t").fingerprint == expected
    assert normalise("id 0b5c4a2e-7f3e-4a57-9d2c-1f1e0e6c9a11 at 3f9a0c1d2e") == "id <id> at <hex>"
    assert cause(Record("x.dlq", 0, 1, None, None, [("a", b"b")])) is None  # not a dead letter


def test_a_preview_is_bounded_text_whatever_the_bytes() -> None:
    assert preview.payload(b'{"a": [1, 2]}').text == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert preview.payload(b"\xff\xfe\x00").kind == "binary"
    assert preview.payload(b"").kind == "empty"
    long = preview.payload(b"x" * 10_000)
    assert long.cut and len(long.text) == preview.PAYLOAD_CHARS and long.size == 10_000
    assert preview.payload(b"a\x00b\x1bc").text == "a\\x00b\\x1bc"
    assert preview.headers([("h", None), ("b", b"\xff"), ("t", b"<b>")]) == [
        ("h", "(null)"), ("b", "0xff"), ("t", "<b>"),
    ]  # fmt: skip


def test_a_chart_lays_the_last_hour_out_in_its_box() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 7, 12, 230, 999)] == [
        1,
        0.5,
        10,
        20,
        250,
        1000,
    ]
    now = 10_000.0
    drawn = charts.chart("Lag", "records", [(now - 7200, 5), (now - 1800, 40), (now, 10)], now)
    assert drawn.top == "50" and drawn.latest == "10"
    points = [tuple(map(float, p.split(","))) for p in drawn.line.split()]
    assert len(points) == 2  # the sample older than the hour is left out
    assert all(0 <= x <= charts.WIDTH and 0 <= y <= charts.HEIGHT for x, y in points)
    assert charts.chart("Lag", "records", [(now, 1)], now).line == ""


def test_the_scrubber_masks_each_secret_in_any_form() -> None:
    settings = Settings(database_url=URL, kafka_overrides={"sasl.password": "kafka-secret-1"})
    assert sorted(settings.secret_values()) == ["kafka-secret-1", "p%40ss-W0rd-x", "p@ss-W0rd-x"]
    scrub = Scrubber([*settings.secret_values(), TOKEN, "ab"])
    text = f"{URL} or p@ss-W0rd-x, {json.dumps('kafka-secret-1')}, {TOKEN}, ab"
    assert scrub.text(text) == ('postgresql://op:***@db.internal:5432/app or ***, "***", ***, ab')
    assert scrub.text("password=hunter2 host=x") == "password=*** host=x"


def test_the_gate_takes_the_token_a_session_or_nothing() -> None:
    gate = Gate(TOKEN, "default-operator")
    assert gate.valid(TOKEN) and not gate.valid(TOKEN + "x") and not gate.valid(None)
    session, who = gate.login("  Ada\n\x00 ")
    assert who.operator == "Ada" and who.csrf and who.session == session
    assert Gate.csrf_ok(who, who.csrf) and not Gate.csrf_ok(who, "forged")
    assert not Gate.csrf_ok(who, None)
    targets = ("/dead-letters", "//evil.example", "https://x", "/\\x", None)
    assert [safe_next(t) for t in targets] == ["/dead-letters", "/", "/", "/", "/"]


def test_console_settings_are_checked_at_start() -> None:
    base = ConsoleSettings(Settings(database_url=URL), TOKEN)
    assert base.validate() is base and base.loopback and TOKEN not in repr(base)
    for bad in ({"token": "short"}, {"trace_url": "http://x/trace"}, {"scan_limit": 0},
                {"trace_url": "javascript:{trace_id}"}, {"operator": " "}):  # fmt: skip
        with pytest.raises(ConfigurationError):
            dataclasses.replace(base, **bad).validate()
    assert not ConsoleSettings(Settings(), TOKEN, host="0.0.0.0").loopback


def test_loading_the_cli_loads_none_of_the_consoles_web_stack() -> None:
    code = (
        "import sys, kinbox.cli.main\n"
        "print(sorted({'starlette', 'uvicorn', 'jinja2', 'multipart'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]"


class FakeKeys:
    def read(self, limit: int) -> ParkedKeys:
        since = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
        key = ParkedKey("g", "orders", "<key>", 3, "ev-1", since)
        return ParkedKeys(enabled=True, keys=[key], actions=True)

    def release(self, group: str, topic: str, key: str) -> int:
        return 3

    def discard(self, group: str, topic: str, key: str) -> int:
        return 3


class FakeActions:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def release_key(self, operator: str, group: str, topic: str, key: str) -> ActionResult:
        self.calls.append((operator, group, topic, key))
        return ActionResult(41, True, "released 3 parked event(s)")


def client(allow_actions: bool) -> tuple[TestClient, FakeActions]:
    settings = ConsoleSettings(Settings(database_url=URL), TOKEN, allow_actions=allow_actions)
    console = Console(settings, publisher=lambda _s: None)  # type: ignore[arg-type,return-value]
    console.keys = FakeKeys()
    fake = FakeActions()
    console.actions = fake  # type: ignore[assignment]
    return TestClient(create_app(console, sample=False), follow_redirects=False), fake


def test_every_page_but_health_and_login_asks_for_the_token_and_carries_the_policy() -> None:
    web, _ = client(allow_actions=False)
    assert web.get("/healthz").status_code == 200
    assert web.get("/login").status_code == 200
    answer = web.get("/parked-keys")
    assert answer.status_code == 303 and answer.headers["location"] == "/login?next=/parked-keys"
    assert answer.headers["content-security-policy"] == CSP and "unsafe-inline" not in CSP
    assert web.get("/api/overview").status_code == 401
    assert web.get("/static/console.css").status_code == 200
    # The URL printed at start: a session cookie, HttpOnly and SameSite=Strict
    logged = web.get(f"/login?token={TOKEN}")
    assert logged.status_code == 303
    cookie = logged.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = web.get("/parked-keys")
    assert page.status_code == 200 and "&lt;key&gt;" in page.text and "<key>" not in page.text
    assert "Release" not in page.text  # read-only: no buttons
    assert "p%40ss-W0rd-x" not in page.text and "p@ss-W0rd-x" not in page.text


def test_a_parked_key_is_released_through_the_interface_when_actions_are_allowed() -> None:
    web, fake = client(allow_actions=True)
    form = {"group": "g", "topic": "orders", "key": "<key>"}
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Operator": "Grace"}
    answer = web.post("/parked-keys/release", data=form, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"decision": 41, "ok": True, "message": "released 3 parked event(s)"}
    assert fake.calls == [("Grace", "g", "orders", "<key>")]
    # A session must send its form's CSRF token
    web.get(f"/login?token={TOKEN}")
    assert web.post("/parked-keys/release", data=form).status_code == 403
    assert web.post("/parked-keys/explode", data=form, headers=headers).status_code == 404


def test_a_read_only_console_refuses_every_action() -> None:
    web, fake = client(allow_actions=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = web.post("/parked-keys/release", data={"group": "g"}, headers=headers)
    assert answer.status_code == 403 and "read-only" in answer.text
    assert fake.calls == []
