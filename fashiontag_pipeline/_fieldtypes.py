"""The type of each field of a settings Struct built in Python code.

``msgspec.convert`` (a TOML file's tables) checks every value against its field's type; a Struct
built by calling it (``EngineConfig(chunk_size=500.0)``, ``ClientConfig(timeout=5)``) checks
nothing, and the value was used as it was: a run ended mid-way on a traceback from deep inside
(a slice of a float, ``'int' object has no attribute 'total'``). Each ``__post_init__`` calls
:func:`check_field_types` first, so a wrong type is a TypeError naming its field where the
settings are built.
"""

from __future__ import annotations

import enum
import re
import typing
from typing import Any

import msgspec

__all__ = ["check_field_types"]


def _as_is(type_: type, obj: Any) -> Any:
    # A field of a type msgspec does not know (Secret): an instance of it is the value.
    if isinstance(type_, type) and isinstance(obj, type_):
        return obj
    raise msgspec.ValidationError(f"Expected `{getattr(type_, '__name__', type_)}`")


def check_field_types(struct: msgspec.Struct, prefix: str) -> None:
    """Raise TypeError naming ``prefix`` + the field when a field's value is not of its type
    (an int stands for a float, as in TOML). The value is never shown (it may be a key)."""
    for field in msgspec.structs.fields(struct):
        value = getattr(struct, field.name)
        try:
            msgspec.convert(value, field.type, strict=True, dec_hook=_as_is)
        except msgspec.ValidationError as err:
            # A value of the right type that is none of the allowed ones (``["top"]``, the
            # service's detections being upper-case): named, or "got list" read as a list
            # refused. (An enum's or a Literal's value is never a key.)
            reason = str(err)
            if reason.startswith("Invalid enum value "):
                named = reason.removeprefix("Invalid enum value ").split(" - at ", 1)[0]
                raise TypeError(
                    f"{prefix}{field.name} must be {_shown(field.type)}: {named} is none of"
                    f" {_allowed(field.type)}"
                ) from None
            raise TypeError(
                f"{prefix}{field.name} must be {_shown(field.type)}, got {type(value).__name__}"
            ) from None


def _allowed(type_: Any) -> str:
    """The values an enum or a Literal inside ``type_`` allows, said."""
    if isinstance(type_, type) and issubclass(type_, enum.Enum):
        return ", ".join(str(member.value) for member in type_)
    if typing.get_origin(type_) is typing.Literal:
        return ", ".join(str(arg) for arg in typing.get_args(type_))
    found = [_allowed(arg) for arg in typing.get_args(type_)]
    return ", ".join(text for text in found if text)


def _shown(type_: Any) -> str:
    """A field's type as its annotation reads (``list[Detection] | None``)."""
    if isinstance(type_, type):
        return type_.__name__
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", str(type_))
