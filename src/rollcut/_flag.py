"""An option's one declaration: a struct field's command-line help beside its type and default
(``name: Annotated[T, flag("help")] = default``). The command line is made from the fields
(``rollcut.cli._flags``), so the flag, its default and its help cannot drift from the option."""

from __future__ import annotations

import typing
from typing import Any

import msgspec

__all__ = ["cli_extra", "declared", "flag", "flag_name"]


def flag(help: str, **cli: Any) -> msgspec.Meta:
    """A field's command-line help (plain text: it is what ``--help`` prints), and how its flag is
    made where that is not read from the field: ``flag`` (its name, else ``--field-name``),
    ``envvar``, ``short`` (another name), ``required`` (a flag the command line must give though
    the struct has a default), ``names`` (a registry whose installed names the help lists), ``min``."""
    return msgspec.Meta(description=help, extra=cli)


def declared(field: msgspec.structs.FieldInfo) -> tuple[Any, msgspec.Meta | None]:
    """A field's type without its annotation, and the :func:`flag` it was declared with (None:
    none). ``FieldInfo.type`` is the resolved annotation, so this reads it as written."""
    if typing.get_origin(field.type) is typing.Annotated:
        base, *extras = typing.get_args(field.type)
        return base, next((m for m in extras if isinstance(m, msgspec.Meta)), None)
    return field.type, None


def cli_extra(field: msgspec.structs.FieldInfo) -> dict[str, Any]:
    """What :func:`flag` said of ``field``'s flag (empty for a field declared without it)."""
    meta = declared(field)[1]
    return dict(meta.extra or {}) if meta is not None else {}


def flag_name(field: msgspec.structs.FieldInfo) -> str:
    """The flag that sets ``field`` on the command line."""
    return str(cli_extra(field).get("flag") or "--" + field.name.replace("_", "-"))
