"""``Event.json()`` decodes exactly what ``json.loads`` of the payload bytes decodes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.event import Event

pytestmark = pytest.mark.unit


def decoded(value: bytes) -> tuple[str, str]:
    try:
        return "ok", repr(Event("i", "t", 0, 0, None, value).json())  # repr: NaN == NaN
    except ValueError:
        return "error", ""


def reference(value: bytes) -> tuple[str, str]:
    try:
        return "ok", repr(json.loads(value))
    except ValueError:
        return "error", ""


DOCUMENT = {"userId": "u-1", "name": "Zoë", "n": [1, 2.5, None, True]}


@pytest.mark.parametrize(
    "value",
    [
        json.dumps(DOCUMENT).encode(),
        json.dumps(DOCUMENT, ensure_ascii=False).encode(),
        b"\xef\xbb\xbf" + json.dumps(DOCUMENT).encode(),  # UTF-8 with a BOM
        *(json.dumps(DOCUMENT).encode(c) for c in ("utf-16", "utf-16-le", "utf-16-be")),
        *(json.dumps(DOCUMENT).encode(c) for c in ("utf-32", "utf-32-le", "utf-32-be")),
        b'{"a": "\xed\xa0\x80"}',  # a lone surrogate, which json takes (surrogatepass)
        b"",
        b"not json",
        b"\xff\xfe\x00",
    ],
)
def test_json_decodes_what_json_loads_decodes(value: bytes) -> None:
    assert decoded(value) == reference(value)


@given(st.binary(max_size=64) | st.from_regex(rb'\A\{"[a-z]{0,5}": ?"[^"]{0,8}"\}\Z'))
def test_any_payload_decodes_or_fails_as_json_loads_does(value: bytes) -> None:
    assert decoded(value) == reference(value)
