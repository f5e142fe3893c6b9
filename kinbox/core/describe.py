r"""Text made from exceptions and records: never raises, always storable.

kinbox writes what went wrong into its log, into the ``reason`` column of
``processed_events`` and into the ``kinbox.dlq.*`` headers of a dead letter.
That text comes from outside: an exception built from payload bytes decoded
with ``surrogateescape`` holds lone surrogates, which UTF-8 cannot encode; a
message can hold NUL, which PostgreSQL ``text`` cannot store; it can be
megabytes long; and ``str(exc)`` itself may raise, for a user exception with
a broken ``__str__``. Recording a verdict must never fail on any of that, so
every place kinbox turns an exception into text goes through this module.

:func:`clean` escapes what cannot be stored (NUL as ``\x00``, a lone surrogate
as ``\udcff``) and bounds the length in UTF-8 bytes; :func:`text` is
``str()`` that cannot raise; :func:`describe` is ``"Type: message"``;
:func:`storable` is what the inbox store writes into a database of a given
encoding.
"""

from __future__ import annotations

MAX_BYTES = 1000
"""Default bound of a cleaned text, in UTF-8 bytes."""

_ELLIPSIS = "..."


def clean(value: str, limit: int | None = MAX_BYTES) -> str:
    """``value`` with NUL and lone surrogates escaped, cut to ``limit`` UTF-8 bytes.

    The result encodes as UTF-8 and PostgreSQL stores it in a UTF8 database.
    (A database in another encoding may still refuse characters it has no
    code for: the inbox store escapes those itself.)
    """
    out = str.replace(value, "\x00", "\\x00")
    try:
        raw = out.encode("utf-8")
    except UnicodeEncodeError:
        raw = out.encode("utf-8", "backslashreplace")
        out = raw.decode("utf-8")
    if limit is None or len(raw) <= limit:
        return out
    # Cut on a character boundary: "ignore" drops a half-cut multi-byte tail.
    return raw[: max(0, limit - len(_ELLIPSIS))].decode("utf-8", "ignore") + _ELLIPSIS


def type_name(obj: object) -> str:
    """The name of ``obj``'s class, cleaned."""
    try:
        return clean(type(obj).__name__, 200)
    except Exception:  # a metaclass with a broken __name__: nothing left to ask
        return "?"


def text(obj: object, limit: int | None = MAX_BYTES) -> str:
    """``str(obj)``, cleaned; never raises.

    When ``str()`` raises (or returns something that is not text), ``repr()``
    is tried, then a placeholder naming the class.
    """
    for render in (str, repr):
        try:
            rendered = render(obj)
            if isinstance(rendered, str):
                return clean(rendered, limit)
        except Exception:
            continue
    return f"<unprintable {type_name(obj)}>"


def describe(exc: BaseException, limit: int | None = MAX_BYTES) -> str:
    """``"Type: message"`` (just ``"Type"`` when the message is empty), cleaned; never raises."""
    name = type_name(exc)
    message = text(exc, limit)
    return clean(f"{name}: {message}" if message else name, limit)


def storable(value: str, server_encoding: str | None) -> str:
    """``value`` as a text column of a database in ``server_encoding`` can always hold it.

    NUL and lone surrogates are escaped (:func:`clean`); in a database whose
    encoding is not UTF8 (``LATIN1``, ``SQL_ASCII``...) so is every non-ASCII
    character, which that encoding may have no code for. ASCII is a subset of
    every server encoding PostgreSQL supports.
    """
    cleaned = clean(value)
    if server_encoding in ("UTF8", None) or cleaned.isascii():
        return cleaned
    return cleaned.encode("ascii", "backslashreplace").decode("ascii")
