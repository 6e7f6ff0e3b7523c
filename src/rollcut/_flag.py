"""An option's one declaration: a struct field's command-line help beside its type and default
(``name: Annotated[T, flag("help")] = default``). The command line is made from the fields
(``rollcut.cli._flags``), so the flag, its default and its help cannot drift from the option."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["cli_extra", "flag", "flag_name"]


def flag(help: str, **cli: Any) -> msgspec.Meta:
    """A field's command-line help (plain text: it is what ``--help`` prints), and how its flag is
    made where that is not read from the field: ``flag`` (its name, else ``--field-name``),
    ``envvar``, ``short`` (another name), ``required`` (a flag the command line must give though
    the struct has a default), ``names`` (a registry whose installed names the help lists), ``min``."""
    return msgspec.Meta(description=help, extra=cli)


def cli_extra(field: msgspec.structs.FieldInfo) -> dict[str, Any]:
    """What :func:`flag` said of ``field``'s flag (empty for a field declared without it)."""
    meta = msgspec.inspect.type_info(field.type)
    return dict(meta.extra or {}) if isinstance(meta, msgspec.inspect.Metadata) else {}


def flag_name(field: msgspec.structs.FieldInfo) -> str:
    """The flag that sets ``field`` on the command line."""
    return str(cli_extra(field).get("flag") or "--" + field.name.replace("_", "-"))
