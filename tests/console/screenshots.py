"""Refresh the console's screenshots in docs/console/: ``python -m tests.console.screenshots``.

Starts the local stack (or uses ``KINBOX_TEST_BOOTSTRAP`` and
``KINBOX_TEST_DATABASE_URL``), makes the tests' dead letters with a real
worker, feeds it good events for a minute so the charts have a shape,
parks an outbox row and a key of the inbox, replays one cause and discards
a dead letter (so the decisions page has rows), and photographs each page
in Chromium.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from kinbox.devstack.stack import local_stack
from tests.console.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ROOT,
    make_dead_letters,
    park_outbox_row,
    produce,
    start_console,
)
from tests.support.database import drop_schema

PAGES = {
    "overview": "/",
    "dead-letters": "/dead-letters",
    "dead-letter-group": None,  # the hostile cause's page, found at run time
    "event": None,
    "parked-keys": "/parked-keys",
    "decisions": "/decisions",
}


def feed(bootstrap: str, topic: str, seconds: float) -> None:
    """Good events at a varying rate, so the throughput and lag charts have a shape."""
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        burst = 40 + int(30 * abs(((n % 20) - 10) / 10))
        produce(bootstrap, topic, [{"kind": "good", "n": n} for _ in range(burst)])
        n += 1
        time.sleep(1)


def main() -> None:
    """Take the screenshots."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    parser.add_argument("--seconds", type=float, default=75.0, help="how long to feed the charts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with local_stack() as stack:
        made = make_dead_letters(stack.bootstrap_servers, stack.database_url)
        park_outbox_row(stack.database_url, made.schema, "order-1842")
        hold = Path(f"{made.broken}.hold")
        hold.touch()  # the account's first posting is dead-lettered, the next two park
        postings: list[dict[str, Any]] = [{"kind": "hold"}, {"kind": "good", "n": 1}]
        produce(stack.bootstrap_servers, made.topic, postings, key=b"account-77")
        console = start_console(
            stack.bootstrap_servers, stack.database_url, made.schema, "--allow-actions",
            "--trace-url", "http://localhost:16686/trace/{trace_id}",
        )  # fmt: skip
        try:
            feeder = threading.Thread(
                target=feed, args=(stack.bootstrap_servers, made.topic, args.seconds)
            )
            feeder.start()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1360, "height": 900})
                page.on("dialog", lambda dialog: dialog.accept())
                page.goto(f"{console.base}/login")
                page.fill("#token", console.token)
                page.fill("#name", "Ada (on call)")
                page.click("button[type=submit]")
                feeder.join()
                made.broken.unlink()  # the fix is deployed: the poison events replay cleanly
                page.goto(f"{console.base}/dead-letters")
                page.locator("tr.group", has_text="ValueError").get_by_role(
                    "button", name="Replay"
                ).click()
                page.wait_for_selector("#flash")
                page.goto(f"{console.base}/dead-letters")
                refuse = page.locator("tr.group", has_text="customer <n> unknown")
                refuse.locator("a.cause").click()
                page.locator(".letter").first.get_by_role("button", name="Discard").click()
                page.wait_for_selector("#flash")
                time.sleep(6)  # a few more samples after the replay
                page.goto(f"{console.base}/dead-letters")
                hostile = page.locator("tr.group", has_text="<b>bold</b>")
                PAGES["dead-letter-group"] = hostile.locator("a.cause").get_attribute("href")
                PAGES["event"] = f"/events?id={made.ids['refuse'][1]}"
                for name, path in PAGES.items():
                    page.goto(f"{console.base}{path}")
                    page.wait_for_load_state("networkidle")
                    page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
                    print(f"wrote {args.out / f'{name}.png'}")
                browser.close()
        finally:
            console.stop()
            made.worker.terminate()
            made.worker.wait(30)
            drop_schema(stack.database_url, made.schema)


if __name__ == "__main__":
    main()
