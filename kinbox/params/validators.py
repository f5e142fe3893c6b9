"""Typed payloads validated by pydantic: its models, and any other type through a ``TypeAdapter``.

The glue to an optional library, outside the driver-free core
(:mod:`kinbox.params.payload` imports it only for a handler whose payload type
needs pydantic; a model was defined with it, so pydantic is loaded already).
``pip install 'kinbox[pydantic]'``.
The validators are built here, at registration, so a type pydantic cannot
handle fails at import, not on the first event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic

from kinbox.core.errors import ConfigurationError
from kinbox.params.signature import describe_type


def json_decoder(target: object, *, where: str) -> Callable[[bytes], object]:
    """``bytes`` (JSON) -> ``target``, validated; raises pydantic's ``ValidationError``."""
    if isinstance(target, type) and issubclass(target, pydantic.BaseModel):
        return target.model_validate_json
    return _adapter(target, where=where).validate_json


def python_converter(target: object, *, where: str) -> Callable[[Any], object]:
    """Python objects (a deserializer's dict) -> ``target``, validated."""
    if isinstance(target, type) and issubclass(target, pydantic.BaseModel):
        return target.model_validate
    return _adapter(target, where=where).validate_python


def _adapter(target: object, *, where: str) -> pydantic.TypeAdapter[Any]:
    try:
        return pydantic.TypeAdapter[Any](target)  # type: ignore[arg-type]  # any type form
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
        raise ConfigurationError(
            f"{where}: pydantic cannot validate the payload type {describe_type(target)}: {exc}"
        ) from exc
