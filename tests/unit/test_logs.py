"""--log-format json: one object a line, extra fields kept, secrets masked in both formats."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kinbox.ops.logs import JsonFormatter, TextFormatter

pytestmark = pytest.mark.unit

URL = "postgresql://app:s3cret@db:5432/kinbox"


def emit(formatter: logging.Formatter, *args: object, **kwargs: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.logs.{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.warning(*args, **kwargs)  # type: ignore[arg-type]
    return stream.getvalue()


def test_a_json_line_has_the_fields_and_the_extras() -> None:
    line = emit(
        JsonFormatter(),
        "dead-lettering %s[%d]@%d",
        "orders", 2, 41,
        extra={"topic": "orders", "partition": 2, "offset": 41, "event_id": "e-1", "obj": object()},
    )  # fmt: skip
    assert line.count("\n") == 1
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["message"] == "dead-lettering orders[2]@41"
    assert (record["topic"], record["partition"], record["offset"]) == ("orders", 2, 41)
    assert record["event_id"] == "e-1" and record["obj"].startswith("<object object")
    assert record["time"].endswith("+00:00") and isinstance(record["pid"], int)


def test_a_traceback_stays_inside_its_one_line() -> None:
    try:
        raise ValueError(f"cannot connect to {URL}\nsecond line")
    except ValueError:
        line = emit(JsonFormatter(), "failed", exc_info=True)
    assert line.count("\n") == 1
    record = json.loads(line)
    assert "ValueError" in record["exception"] and "s3cret" not in record["exception"]


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_a_password_never_reaches_the_output(formatter: logging.Formatter) -> None:
    out = emit(formatter, "connecting to %s (dsn %s)", URL, "host=db password=hunter2 user=app",
               extra={"url": URL})  # fmt: skip
    assert "s3cret" not in out and "hunter2" not in out
    assert "app:***@db" in out and "password=***" in out
