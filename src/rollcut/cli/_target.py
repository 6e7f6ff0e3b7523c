"""The root command, and what every command shares: where it works, how it reports, how it fails.

Options that several commands take (``--url``, ``--home``, ``--namespace``,
``--credentials``, ``--ledger``, ``--tokens``) are declared once, here, and
added to a command by :func:`targeted`, which hands the command one
:class:`Target`. A command never opens the bus, the ledger or the token
store by itself: it asks its target.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._errors import BusError, RollcutError, StorageError
from .._process import BUS_LOST_EXIT

if TYPE_CHECKING:  # the heavy parts load when a command runs, not for every `rollcut --help`
    from ..bus import EventLog
    from ..ledger import Ledger
    from ..tokens import LocalTokenStore

__all__ = [
    "EXIT_CODES",
    "ExitCode",
    "Opened",
    "Target",
    "app",
    "console",
    "fail",
    "print_json",
    "progress_bar",
    "report",
    "run",
    "targeted",
    "with_options",
]


class ExitCode(IntEnum):
    """What every rollcut command's exit status means (also in ``rollcut --help`` and the README)."""

    OK = 0
    """Everything asked was done: for ``collect``, every rollout's row is written."""
    ROLLOUTS_FAILED = 1
    """Some rollouts failed for good or are left without a row; they are listed."""
    USAGE = 2
    """Usage, config or corrupt-state error; the message names the fix."""
    SOFTWARE = 70
    """An internal error: a bug in rollcut (the traceback is printed)."""
    STORAGE = 74
    """Storage or the bus failed (disk full or unwritable, server unreachable or out of space)."""
    REQUEUE = 75
    """Checkpointed after SIGTERM, or stopped because the bus stopped answering: requeue the job and
    run it again with ``--resume``."""
    BUS_LOST = BUS_LOST_EXIT
    """A server's bus identity was revoked (another process took its instance name): it stopped, and
    is not started again under that name; give one of the two servers another ``--name``."""


EXIT_CODES = "\n".join(f"{int(c):>3}  {(c.__doc__ or '').strip()}" for c in ExitCode)


app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Crash-safe partial-rollout checkpointing.",
    pretty_exceptions_enable=False,  # an escaped error gets its exit code from the table, in main()
)
"""The root ``rollcut`` command."""


@app.callback()
def _root() -> None:
    # A callback keeps the root a group: typer makes an app with one command that command itself,
    # and ``main`` loads only the command it runs (``rollcut demo`` would then refuse ``demo``).
    pass


console = Console(stderr=True)

T = TypeVar("T")

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="ROLLCUT_URL",
        help="NATS URL, or a cluster's URLs comma-separated; omitted: the embedded server under --home.",
    ),
]
ReplicasOpt = Annotated[
    int,
    typer.Option(
        "--replicas",
        envvar="ROLLCUT_REPLICAS",
        min=1,
        help="Copies of the stream when it is created (3 on a three-node cluster).",
    ),
]
HomeOpt = Annotated[
    Path | None, typer.Option("--home", envvar="ROLLCUT_HOME", help="Data directory (default ./.rollcut).")
]
NsOpt = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        "-n",
        envvar="ROLLCUT_NAMESPACE",
        help="Event namespace (default: the one the embedded server under --home holds, else 'default').",
    ),
]
CredsOpt = Annotated[
    Path | None,
    typer.Option("--credentials", envvar="ROLLCUT_CREDENTIALS", help="Role credentials file for --url."),
]
LedgerOpt = Annotated[Path | None, typer.Option("--ledger", help="Ledger directory (default HOME/ledger).")]
TokensOpt = Annotated[
    Path | None, typer.Option("--tokens", help="Token store directory (default HOME/tokens).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


@dataclass(frozen=True)
class Opened:
    """The bus, the ledger and the token store a control command works on."""

    log: EventLog
    ledger: Ledger
    tokens: LocalTokenStore


@dataclass(frozen=True)
class Target:
    """Where a command works: the bus (a URL, or the embedded server under ``home``) and the files."""

    url: str | None = None
    home: Path = Path(".rollcut")
    namespace: str = "default"
    credentials: Path | None = None
    ledger_dir: Path | None = None
    tokens_dir: Path | None = None
    replicas: int = 1

    @property
    def ledger_path(self) -> Path:
        """``--ledger``, else ``HOME/ledger``."""
        return self.ledger_dir or self.home / "ledger"

    @property
    def tokens_path(self) -> Path:
        """``--tokens``, else ``HOME/tokens``."""
        return self.tokens_dir or self.home / "tokens"

    def log(self, role: str = "admin") -> AbstractAsyncContextManager[EventLog]:
        """The event log, as ``role``."""
        from .._home import open_log

        return open_log(
            self.url,
            home=self.home,
            namespace=self.namespace,
            role=role,
            credentials=self.credentials,
            replicas=self.replicas,
        )

    def ledger(self, *, readonly: bool = False) -> Ledger:
        """The LMDB ledger."""
        from ..ledger import Ledger

        return Ledger(self.ledger_path, readonly=readonly)

    @asynccontextmanager
    async def opened(self, role: str = "admin") -> AsyncIterator[Opened]:
        """The log, the ledger and the token store together, closed together."""
        from ..tokens import LocalTokenStore

        async with self.log(role) as log:
            with self.ledger() as led, LocalTokenStore(self.tokens_path) as tk:
                yield Opened(log, led, tk)


_TARGET_OPTIONS: dict[str, tuple[Any, Any]] = {
    "url": (UrlOpt, None),
    "replicas": (ReplicasOpt, 1),
    "home": (HomeOpt, None),
    "namespace": (NsOpt, None),
    "credentials": (CredsOpt, None),
    "ledger": (LedgerOpt, None),
    "tokens": (TokensOpt, None),
}


def with_options(
    table: dict[str, tuple[Any, Any]], build: Callable[[dict[str, Any]], Any], into: str
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Add the options of ``table`` (name -> (annotated type, default)) to a command, and pass it
    ``build(their values)`` as the argument ``into`` instead. Typer reads the command's signature,
    so the options appear in its ``--help`` as if the command had declared them itself."""

    def deco(fn: Callable[..., T]) -> Callable[..., T]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != into]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for name, (annotation, default) in table.items()
        ]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            given = {name: kwargs.pop(name) for name in table}
            return fn(*args, **{into: build(given)}, **kwargs)

        params = own + added
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


def targeted(*options: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Add the named shared options to a command and pass it ``target: Target`` built from them."""
    unknown = set(options) - set(_TARGET_OPTIONS)
    if unknown:
        raise ValueError(f"no shared options {sorted(unknown)}")

    def build(given: dict[str, Any]) -> Target:
        from .._home import default_home, home_namespace

        home = given.get("home") or default_home()
        url = given.get("url")
        return Target(
            url=url,
            home=home,
            namespace=given.get("namespace") or (None if url else home_namespace(home)) or "default",
            credentials=given.get("credentials"),
            ledger_dir=given.get("ledger"),
            tokens_dir=given.get("tokens"),
            replicas=given.get("replicas") or 1,
        )

    return with_options({n: _TARGET_OPTIONS[n] for n in options}, build, "target")


def progress_bar(*, disable: bool) -> Progress:
    """The one progress bar every long command shows on stderr (off with ``--json``)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=disable,
    )


def print_json(obj: Any) -> None:
    """One JSON object on stdout."""
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Say what went wrong on stderr, on one line whatever the terminal's width (a log grepped for
    an error must find it whole), with the message's own brackets shown, not read as markup;
    raise the returned exit to leave with ``code``."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine: a storage or bus failure is one line and exit 74, any other rollcut
    error one line and exit 2, anything else a bug (its traceback, exit 70). Never swallowed."""
    try:
        return asyncio.run(coro)
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:
        raise typer.Exit(exit_for(exc)) from exc


def exit_for(exc: BaseException) -> int:
    """The exit code of an error that left a command (the README's table): a storage, bus or OS
    error (unwritable, disk full) 74, any other rollcut error 2, anything else 70 (a bug, with its
    traceback). One line on stderr, never a traceback, unless it is a bug."""
    if isinstance(exc, StorageError | BusError | OSError):
        what = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
        fail(what, ExitCode.STORAGE)
        return ExitCode.STORAGE
    if isinstance(exc, RollcutError):
        fail(str(exc), ExitCode.USAGE)
        return ExitCode.USAGE
    console.print_exception()
    fail(f"internal error: {exc!r}", ExitCode.SOFTWARE)
    return ExitCode.SOFTWARE


def report(title: str, out: dict[str, Any], as_json: bool) -> None:
    """Print a result as one JSON object or as a two-column table."""
    if as_json:
        print_json(out)
        return
    table = Table("metric", "value", title=title)
    for k, v in out.items():
        table.add_row(k, str(v))
    Console().print(table)
