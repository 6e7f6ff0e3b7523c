"""Strict mirrors of the event types, for validating what enters the log.

Why two views of one schema: identifiers that become NATS subject tokens or
header values must be checked against a safe alphabet, and msgspec does that
with a regex per field, about 0.6 us each. Checking five to seven ids on
every *read* of a record that was already checked when it was *written*
costs more than the rest of decoding. So the real event classes bound ids by
length only (cheap, and enough to decode safely), and this module derives,
from those same classes, mirror types whose ids carry the full patterns. The
codec validates every outgoing event against the mirrors, so nothing with a
bad id is ever stored, and error messages still name the field path and the
rule. There is one schema definition; the mirrors cannot drift from it.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta

__all__ = ["HEX_PATTERN", "TOKEN_PATTERN", "strict_union"]

TOKEN_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
HEX_PATTERN = r"^[0-9a-f]{16,128}$"
_KIND_TO_PATTERN = {"token": TOKEN_PATTERN, "hex": HEX_PATTERN}


def _strict_annotation(tp: Any, mirrors: dict[type, type]) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *metas = typing.get_args(tp)
        out = []
        for m in metas:
            kind = (m.extra or {}).get("rollcut") if isinstance(m, Meta) else None
            out.append(Meta(pattern=_KIND_TO_PATTERN[kind]) if kind in _KIND_TO_PATTERN else m)
        return Annotated[(_strict_annotation(base, mirrors), *out)]
    if origin in (Union, types.UnionType):
        return Union[tuple(_strict_annotation(a, mirrors) for a in typing.get_args(tp))]  # noqa: UP007
    if origin is not None:
        args = typing.get_args(tp)
        return origin[tuple(_strict_annotation(a, mirrors) for a in args)] if args else tp
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _mirror(tp, mirrors)
    return tp


def _mirror(cls: type, mirrors: dict[type, type]) -> type:
    if cls in mirrors:
        return mirrors[cls]
    cfg = cls.__struct_config__  # type: ignore[attr-defined]
    fields = []
    for f in msgspec.structs.fields(cls):
        ann = _strict_annotation(f.type, mirrors)
        if f.default is not msgspec.NODEFAULT:
            fields.append((f.name, ann, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, ann, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, ann, msgspec.NODEFAULT))
    mirror = msgspec.defstruct(
        f"Strict{cls.__name__}",
        fields,
        kw_only=True,
        frozen=True,
        tag=cfg.tag,
        tag_field=cfg.tag_field,
    )
    mirrors[cls] = mirror
    return mirror


def strict_union(union: Any) -> Any:
    """The strict mirror of a union of event structs."""
    mirrors: dict[type, type] = {}
    return Union[tuple(_mirror(t, mirrors) for t in typing.get_args(union))]  # noqa: UP007
