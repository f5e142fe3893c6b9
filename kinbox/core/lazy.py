"""Public names that load on first use (PEP 562), for the packages' ``__init__``.

A package says where each of its public names lives, and importing the
package loads none of them: importing one submodule (``kinbox.core.errors`` from
``producer_outbox``, ``producer_outbox.writer`` in a writer-only service) does
not drag in the rest and their drivers. Imports nothing of kinbox, so every
package of both may use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(
    module: str, sources: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``(__getattr__, __dir__)`` for ``module``, which is being initialised.

    Args:
        module: the package's ``__name__``.
        sources: each public name and the module it is imported from on first use.
    """
    namespace = sys.modules[module].__dict__

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(sources))

    return __getattr__, __dir__
