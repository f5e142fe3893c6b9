"""The console tests' fixtures: real dead letters, two real consoles, a real Chromium.

One worker's dead letters serve the whole module, as do two ``kinbox
console`` processes started from the CLI: one with ``--allow-actions`` and
one read-only. The browser is Debian's ``chromium`` driven by Playwright
(its own browser download is not used): missing, it skips these tests, and
fails them in CI (``make test`` installs it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from kinbox.core.errors import ServiceError
from kinbox.devstack.stack import Stack
from tests.conftest import cannot_start
from tests.console.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ConsoleProcess,
    DeadLetters,
    make_dead_letters,
    start_console,
)
from tests.support.database import drop_schema

TRACE_URL = "http://tracing.invalid/trace/{trace_id}"
OPERATOR = "Ada on call"


@pytest.fixture(scope="module")
def made(stack: Stack) -> Iterator[DeadLetters]:
    """The dead letters of a real worker run; the worker goes on running (it applies replays)."""
    letters = make_dead_letters(stack.bootstrap_servers, stack.database_url)
    try:
        yield letters
    finally:
        if letters.worker.poll() is None:
            letters.worker.terminate()
            letters.worker.wait(30)
        drop_schema(stack.database_url, letters.schema)
        with contextlib.suppress(FileNotFoundError):
            letters.broken.unlink()


@pytest.fixture(scope="module")
def console(stack: Stack, made: DeadLetters) -> Iterator[ConsoleProcess]:
    """``kinbox console --allow-actions`` on the dead letters' schema."""
    running = start_console(
        stack.bootstrap_servers, stack.database_url, made.schema, "--allow-actions",
        "--trace-url", TRACE_URL,
    )  # fmt: skip
    yield running
    running.stop()


@pytest.fixture(scope="module")
def readonly(stack: Stack, made: DeadLetters) -> Iterator[ConsoleProcess]:
    """``kinbox console`` (read-only) on the same schema."""
    running = start_console(stack.bootstrap_servers, stack.database_url, made.schema)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright."""
    if not Path(CHROMIUM).exists() or not os.access(CHROMIUM, os.X_OK):
        cannot_start("Chromium", ServiceError(f"{CHROMIUM} is missing: apt-get install chromium"))
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # Playwright's own error type differs between versions
            cannot_start("Chromium", ServiceError(str(exc)))
        yield launched
        launched.close()


def logged_in(browser: Browser, running: ConsoleProcess, name: str = OPERATOR) -> Page:
    """A fresh browser context logged in through the login form, confirmations accepted."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{running.base}/login")
    page.fill("#token", running.token)
    page.fill("#name", name)
    page.click("button[type=submit]")
    page.wait_for_url(f"{running.base}/")
    return page


@pytest.fixture
def page(browser: Browser, console: ConsoleProcess) -> Iterator[Page]:
    """A page logged in to the console that allows actions."""
    opened = logged_in(browser, console)
    yield opened
    opened.context.close()
