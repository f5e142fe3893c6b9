r"""PostgreSQL array literals for the claim's ``unnest``, built in one pass each.

psycopg dumps a Python list element by element in Python (a dumper call and a
regular expression per element): the claim's four arrays of a 500-event
batch were about a tenth of a batch worker's CPU. A literal built with one
``join`` is a single text parameter, and the server parses it in C. What the
literal holds is exactly the elements: each text element is quoted, with
``"`` and ``\`` backslash-escaped, the only characters that mean anything
inside quotes (https://www.postgresql.org/docs/current/arrays.html#ARRAYS-IO).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def text_array(values: Sequence[str]) -> str:
    """A ``text[]`` literal holding ``values`` (none of them NULL) exactly."""
    if not values:
        return "{}"
    plain = ",".join(values)  # a comma adds no quote nor backslash
    if '"' in plain or "\\" in plain:
        return '{"' + '","'.join(_escaped(v) for v in values) + '"}'
    return '{"' + '","'.join(values) + '"}'


def int_array(values: Iterable[int]) -> str:
    """An ``int[]`` / ``bigint[]`` literal holding ``values``."""
    return "{" + ",".join(map(str, values)) + "}"


def hex_array(values: Iterable[str | None]) -> str:
    """A ``text[]`` literal of hexadecimal strings (nothing to quote) or NULLs."""
    return "{" + ",".join("NULL" if v is None else v for v in values) + "}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
