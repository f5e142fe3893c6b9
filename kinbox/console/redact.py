"""Secrets never reach a page, a JSON answer or a log line of the console.

Two nets. :func:`kinbox.core.config.redact_url` masks the password of anything
shaped like a database URL or conninfo, wherever it came from. And a
:class:`Scrubber` knows the secrets themselves — the database password (as
written and URL-decoded), secret ``-X`` values, the access token — and
replaces each wherever it appears, whatever surrounds it: an error text from
a library, a header of a dead letter, a payload. Every value a template
prints and every JSON answer passes through it (see :mod:`kinbox.console.app`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from markupsafe import Markup, escape

from kinbox.core.config import MASK, redact_url


class Scrubber:
    """Masks known secret values and URL passwords in text.

    Args:
        secrets: values never to show; those shorter than 4 characters are
            masked only inside URLs (masking ``a`` everywhere would garble
            every page and hide nothing worth hiding).
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = {s for s in secrets if len(s) >= 4}
        # JSON escapes quotes and backslashes: a secret holding one appears
        # escaped in a JSON answer.
        # and HTML escapes <, >, &, quotes: one appears escaped in a page.
        kept |= {json.dumps(s)[1:-1] for s in kept} | {str(escape(s)) for s in kept}
        self._secrets = sorted(kept, key=len, reverse=True)

    def text(self, value: str) -> str:
        """``value`` with every secret masked."""
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return redact_url(value) if "://" in value or "password" in value.lower() else value

    def finalize(self, value: object) -> object:
        """Jinja's ``finalize``: each printed value masked, its markup kept.

        Markup (a macro's or a block's output, already escaped) stays
        Markup, so it is not escaped twice; anything else is masked as
        text and then escaped by the autoescaping.
        """
        if value is None:
            return ""
        if isinstance(value, Markup):
            masked = self.text(str(value))
            return value if masked == str(value) else Markup(masked)
        if isinstance(value, str):
            return self.text(value)
        return value
