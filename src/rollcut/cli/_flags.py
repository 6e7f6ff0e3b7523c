"""A command's flags made from an options struct: one flag per field, its type, default and help read
from the field (``Annotated[T, rollcut._flag.flag(help, ...)]``), so an option is declared once, on
the struct, and the command line, a worker's JSON and the harness's argv cannot drift apart.

What a terminal takes is mapped once here: a ``dict[str, str]`` field is a repeated ``KEY=VALUE``
flag, a list a repeated flag, an enum or a ``Literal`` a string (the server's check refuses what is
not one of its values, naming them, exit 2), a bool a flag that is on when given.
"""

from __future__ import annotations

import enum
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
import typer

from .._flag import declared, flag_name
from ._target import fail

__all__ = ["command_of"]

S = TypeVar("S", bound=msgspec.Struct)


def _names(registry: str) -> str:
    """What a registry has installed, for a flag's help (lists names; imports nothing)."""
    from .. import _registries

    return ", ".join(getattr(_registries, registry).names()) or "none installed"


def _terminal_type(base: Any) -> Any:
    """What typer parses for a field of type ``base``: a list's items, a mapping's ``KEY=VALUE``
    strings, an enum's or a ``Literal``'s value as a string."""
    origin = typing.get_origin(base)
    if origin is list:
        return list[typing.get_args(base)[0]] | None  # type: ignore[misc]
    if origin is dict:
        return list[str] | None
    if origin is typing.Literal or (isinstance(base, type) and issubclass(base, enum.Enum)):
        return str
    return base


def _parameter(field: msgspec.structs.FieldInfo, argument: bool, required: bool = True) -> inspect.Parameter:
    base, meta = declared(field)
    extra = dict(meta.extra or {}) if meta is not None else {}
    text = meta.description or "" if meta is not None else ""
    if "names" in extra:
        text += f" Installed: {_names(extra['names'])}."
    default: Any = field.default
    if default is msgspec.NODEFAULT and field.default_factory is not msgspec.NODEFAULT:
        default = field.default_factory()
    kind = _terminal_type(base)
    if isinstance(default, list | dict):
        default = None  # a repeated flag: typer's None is "not given"
    elif isinstance(default, enum.Enum):
        default = default.value
    if argument:  # the first is required; a later one may be left out (its field's default)
        info: Any = typer.Argument(help=text)
        default = inspect.Parameter.empty if required else default
    else:
        decls = [flag_name(field), *([extra["short"]] if "short" in extra else [])]
        info = typer.Option(*decls, help=text, envvar=extra.get("envvar"), min=extra.get("min"))
        if extra.get("required"):
            default = inspect.Parameter.empty
        elif default is msgspec.NODEFAULT:  # given by its envvar, or empty for the server's check to refuse
            default = kind()
    return inspect.Parameter(
        field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
    )


def _pairs(flag: str, given: list[str]) -> dict[str, str]:
    """A repeated ``FLAG KEY=VALUE`` as a mapping; refused naming what is not a pair."""
    bad = [g for g in given if "=" not in g]
    if bad:
        raise fail(f"{flag} takes KEY=VALUE, got {', '.join(bad)}")
    return dict(g.split("=", 1) for g in given)


def command_of(
    cls: type[S], run: Callable[[S], None], *, arguments: tuple[str, ...] = ()
) -> Callable[..., None]:
    """A typer command whose flags are ``cls``'s fields (``arguments`` its positional ones); it builds
    ``cls`` from what was given and hands it to ``run``, whose check refuses a value it cannot run
    with, naming the choices (an enum's or a registry's), before anything is bound."""
    fields = msgspec.structs.fields(cls)
    first = arguments[0] if arguments else None
    params = [_parameter(f, f.name in arguments, required=f.name == first) for f in fields]
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # typer: required ones first
    mappings = {  # field -> its flag, for the error naming it
        f.name: flag_name(f) for f in fields if typing.get_origin(declared(f)[0]) is dict
    }

    def command(**given: Any) -> None:
        values = {
            k: (_pairs(mappings[k], v) if k in mappings else v) for k, v in given.items() if v is not None
        }
        run(cls(**values))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    functools.update_wrapper(command, run, assigned=("__module__",), updated=())
    return command
