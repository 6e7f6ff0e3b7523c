"""``rollcut demo``: the main job, told as it happens, then what rollcut saved against the alternatives.

Every story event (``rollcut.collect``'s :data:`StoryEvent`) becomes one line above
the progress bar on stderr, so the crash, the restart and each continuation are
seen when they happen; the summary tables and the commands to try next go to
stdout. ``--json`` prints one object with the same numbers and nothing else.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ._target import JsonOpt, app, console, fail, print_json, progress_bar, run
from ._workload import (
    DEMO_ROLLOUTS,
    AgentOpt,
    DemoRolloutsOpt,
    ModelOpt,
    SeedOpt,
    refuse_workload,
    rollouts_of,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..demo import Resumed, StoryEvent

__all__ = ["demo_cmd"]

_SHOWN_CONTINUATIONS = 8  # the first few each get a line; the rest are counted


@app.command("demo")
def demo_cmd(
    rollouts: DemoRolloutsOpt = None,
    seed: SeedOpt = 0,
    no_crash: Annotated[
        bool, typer.Option("--no-crash", help="Do not kill the Gym processes mid-run.")
    ] = False,
    no_compare: Annotated[
        bool,
        typer.Option(
            "--no-compare",
            help="Skip recovering copies of the crash from the last checkpoint and from input.",
        ),
    ] = False,
    home: Annotated[
        Path | None,
        typer.Option(
            "--home",
            help="Where the demo keeps its rows, logs, ledger and stream (default: a new "
            "rollcut-demo-<time> directory here).",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="Generate with a real inference engine: llama.cpp (its server on a tiny model, built "
            "once: `rollcut engine build`) or vllm with --engine-url.",
        ),
    ] = None,
    engine_url: Annotated[
        str, typer.Option("--engine-url", help="An engine already running (its base URL).")
    ] = "",
    model: ModelOpt = "tiny",
    baseline_every: Annotated[
        float | None,
        typer.Option(
            "--baseline-every",
            help="Seconds between the checkpoints of the last-checkpoint way (default: the longer of "
            "NeMo Gym's 5% floor, 4 s, and one episode; docs/demo-and-report.md).",
        ),
    ] = None,
    agent: AgentOpt = "simple",
    nemo_gym: Annotated[
        bool,
        typer.Option(
            "--nemo-gym",
            help="Run NeMo Gym's own resources servers, unmodified (installed once: `rollcut nemo-gym "
            "install`), on their own example rows, behind rollcut's journal (docs/nemo-gym.md).",
        ),
    ] = False,
    unpaced: Annotated[
        bool,
        typer.Option(
            "--unpaced",
            help="Let the local model generate as fast as it can (by default it decodes at the pace of "
            "Gemma 3 270M on two cores, so the seconds follow the tokens; docs/demo-and-report.md).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The main job: collect with checkpoints, SIGKILL every Gym process mid-run, resume, and show what
    that saved against recovering the same crash from the last checkpoint only and from input."""
    from ..demo import ALTERNATIVES, run_demo
    from ..gym.model.engine import DIALECTS

    if engine is not None and engine not in DIALECTS:
        raise fail(f"unknown engine {engine!r}; have: {', '.join(DIALECTS)}")
    refuse_workload(engine=engine, agent=agent, model=model)
    if engine == "vllm" and not engine_url:
        raise fail("--engine vllm needs --engine-url (rollcut starts only llama.cpp's server itself)")
    if baseline_every is not None and baseline_every <= 0:
        raise fail("--baseline-every takes a number of seconds above 0")
    if nemo_gym and agent != "simple":
        raise fail("--nemo-gym runs NeMo Gym's servers with the Simple Agent: leave --agent out")
    if nemo_gym:
        from ..gym.resources import NemoGymUnavailableError, install_nemo_gym

        try:
            with console.status("NeMo Gym's environment (installed once, cached after)"):
                install_nemo_gym()
        except NemoGymUnavailableError as exc:
            raise fail(str(exc)) from exc
    rollouts = rollouts_of(rollouts, model, local=DEMO_ROLLOUTS)
    home = (home or Path.cwd() / time.strftime("rollcut-demo-%Y%m%d-%H%M%S")).absolute()
    with progress_bar(disable=as_json) as prog:
        teller = _Teller(prog, rollouts, quiet=as_json)
        if not as_json:
            console.print(f"[bold]rollcut demo[/bold]: {rollouts} rollouts, kept in {home}")
        out = run(
            run_demo(
                rollouts=rollouts,
                seed=seed,
                crash=not no_crash,
                compare=() if no_compare else tuple(ALTERNATIVES),
                home=home,
                story=teller,
                engine=engine,
                engine_url=engine_url,
                engine_model=model,
                baseline_every_s=baseline_every,
                agent=agent,
                nemo_gym=nemo_gym,
                paced=not unpaced,
            )
        )
    if as_json:
        print_json(out)
        return
    _summarize(out, teller.example)


class _Teller:
    """The story's lines, printed above the progress bar as they happen."""

    def __init__(self, prog: Progress, total: int, *, quiet: bool) -> None:
        self.prog, self.quiet = prog, quiet
        self.task: TaskID = prog.add_task("collecting", total=total)
        self.example = ""  # a rollout that continued, to suggest replaying
        self.collecting = "collecting"

    def say(self, line: str) -> None:
        if not self.quiet:
            self.prog.console.print(line, highlight=False, soft_wrap=True)

    def __call__(self, ev: StoryEvent) -> None:
        from ..demo import Checkpointed, Compared, Comparing, Crashed, Progressed, Resumed, Started

        if isinstance(ev, Progressed):
            self.collecting = f"collecting ({ev.running} running, {ev.checkpoints} checkpoints published)"
            self.prog.update(self.task, completed=ev.finished, description=self.collecting)
        elif isinstance(ev, Started):
            what = "restarted" if ev.restarted else "started"
            names = ", ".join(ev.processes)
            self.say(f"[green]▶[/green] {what} the Gym processes ({names}); JetStream at {ev.nats_url}")
        elif isinstance(ev, Checkpointed):
            s = ev.standing
            self.say(
                f"[cyan]✓[/cyan] checkpoint {ev.number} published: cut at stream seq {ev.cut}; "
                f"{s.finished} finished, {s.mid_episode} mid-episode, {s.not_yet} not past turn one "
                f"({ev.ms:.0f} ms, the collection paused {ev.pause_ms:.0f} ms)"
            )
        elif isinstance(ev, Crashed):
            killed = ", ".join(f"{n} (pid {pid})" for n, pid in ev.killed.items())
            self.say(
                f"[bold red]✗ CRASH[/bold red]: SIGKILL to every Gym process: {killed}. "
                f"{ev.standing.mid_episode} rollouts were mid-episode, {ev.standing.finished} finished"
            )
        elif isinstance(ev, Resumed):
            self._resumed(ev)
        elif isinstance(ev, Comparing):
            label = _WAYS[ev.way]
            self.prog.update(self.task, description=f"recovering a copy: {_HEADERS[ev.way]}")
            self.say(f"[yellow]≈[/yellow] the same crash on a copy made at it ({ev.home}), recovered {label}")
        elif isinstance(ev, Compared):
            self.prog.update(self.task, description=self.collecting)
            c = ev.cost
            self.say(
                f"  {_WAYS[ev.way]}: {c['model_calls_regenerated']} model calls and "
                f"{c['tool_calls_reexecuted']} tool calls done again, {c['after_crash_s']:.1f} s to finish"
            )

    def _resumed(self, ev: Resumed) -> None:
        where = (
            f"checkpoint {ev.checkpoint_id} (cut at stream seq {ev.cut})" if ev.checkpoint_id else "nothing"
        )
        self.say(
            f"[green]⟲[/green] resume from {where}: {ev.finished} finished rollouts kept (never run "
            f"again), {len(ev.continued)} continue where they were, {ev.started_over} start over, "
            f"{ev.never_started} had not started"
        )
        for c in ev.continued[:_SHOWN_CONTINUATIONS]:
            self.say(f"   ↪ {c.rollout_id} continues as attempt {c.attempt} after {c.unit} {c.turns_done}")
        more = len(ev.continued) - _SHOWN_CONTINUATIONS
        if more > 0:
            self.say(f"   ↪ … and {more} more")
        if ev.continued:
            self.example = max(ev.continued, key=lambda c: c.turns_done).rollout_id


_WAYS = {
    "rollcut": "by rollcut (continue from the sealed tail)",
    "last_checkpoint": "from the last checkpoint only",
    "restart": "from input (no partial-rollout checkpointing)",
}
_HEADERS = {"rollcut": "rollcut", "last_checkpoint": "last checkpoint only", "restart": "restart from input"}

_COST_ROWS = [
    (
        "model_calls_regenerated",
        "model calls generated again",
        "completed calls whose request was generated again",
    ),
    ("tokens_regenerated", "tokens generated again", "the tokens of those calls"),
    (
        "tokens_lost_in_flight",
        "tokens lost in flight",
        "generated for calls the crash stopped, past what their cut kept (the model's own count)",
    ),
    ("tool_calls_reexecuted", "tool calls executed again", "environment mutations repeated (same revision)"),
    ("model_calls_kept", "model calls kept", "calls completed before the crash that recovery took over"),
    ("tokens_kept", "tokens kept", "their tokens: generation the crash did not cost"),
    ("tokens_generated_after_crash", "tokens generated after", "what the model generated to finish"),
    ("after_crash_s", "seconds to finish", "from restarting the servers to the last row written"),
]


_NEMO_ROWS = [
    ("rollouts", "rollouts", "its rows' rollouts"),
    ("continued", "continued", "attempts continued from a cut after the crash"),
    ("started_over", "started over", "attempts begun again from the input (a divergence among them)"),
    ("calls_replayed", "calls replayed", "journaled calls given to a fresh session to rebuild it at a cut"),
    ("model_calls_kept", "model calls kept", "completed before the crash, not generated again"),
    ("tool_calls_kept", "tool calls kept", "applied before the crash, not executed again"),
    ("model_calls_regenerated", "model calls again", "what the crash cost: generated a second time"),
    ("tool_calls_reexecuted", "tool calls again", "what the crash cost: executed a second time"),
]


def _nemo_gym_table(con: Console, servers: dict[str, dict[str, Any]]) -> None:
    """Per NeMo Gym server (a column each): the level it ran at, what the crash cost it and what it
    kept; then what each row means and why each server stands at its level."""
    lv = Table(title="NeMo Gym's own servers, unmodified, under rollcut")
    lv.add_column("", no_wrap=True)
    for server in servers:
        lv.add_column(server, justify="right")
    lv.add_row("level", *[s["level"] for s in servers.values()])
    for key, name, _ in _NEMO_ROWS:
        lv.add_row(name, *[_num(s[key]) for s in servers.values()])
    con.print(lv)
    _legend(con, [(name, meaning) for _, name, meaning in _NEMO_ROWS])
    _legend(con, [(server, s["why"]) for server, s in servers.items()])


def _summarize(out: dict[str, Any], example: str) -> None:
    """The run in one table, the comparison in another, each with a legend; then where it all is."""
    con = Console()
    rec = out["recovery"]
    rows = [
        ("rows written", f"{out['results_written']} of {out['rollouts']}", "one NeMo Gym row per rollout"),
        ("duplicate rows", out["duplicate_results"], "rollouts written twice (must be 0)"),
        ("crashes", out["crashes"], "every Gym process SIGKILLed at once"),
        (
            "checkpoints published",
            out["checkpoints_published"],
            "cuts a restore can use (the resume's included)",
        ),
        ("finished before the crash", rec["completed"], "kept as they were, never run again"),
        ("continued", rec["continue"], "resumed mid-episode as their next attempt"),
        (
            "started over",
            rec["fresh_dispatch"] - out["fresh_dispatch_never_started"],
            "begun, nothing to keep",
        ),
        ("not started at the crash", out["fresh_dispatch_never_started"], "dispatched later, on attempt 1"),
        ("checkpoint ms", _ms(out["checkpoint_ms_p50"], out["checkpoint_ms_p99"]), "p50 / p99, to publish"),
        (
            "paused ms",
            _ms(out["checkpoint_pause_ms_p50"], out["checkpoint_pause_ms_p99"]),
            "p50 / p99, the collection held still per checkpoint",
        ),
        ("wall time", f"{out['wall_s']:.1f} s", "the whole demo, comparisons included"),
    ]
    if out.get("nemo_gym"):
        _nemo_gym_table(con, out["nemo_gym"])
    run_t = Table("what", "value", title="rollcut demo: the run")
    for what, value, _ in rows:
        run_t.add_row(what, str(value))
    con.print(run_t)
    _legend(con, [(what, meaning) for what, _, meaning in rows])
    if out["compared"]:
        ways = list(out["compared"])
        cmp_t = Table(title="what the crash cost, measured in this run")
        cmp_t.add_column("", no_wrap=True)  # a row's name on one line; the headers wrap instead
        for w in ways:
            cmp_t.add_column(_HEADERS[w], justify="right")
        for key, name, _ in _COST_ROWS:
            cmp_t.add_row(name, *[_num(out["compared"][w][key]) for w in ways])
        con.print(cmp_t)
        _legend(con, [(name, meaning) for _, name, meaning in _COST_ROWS])
        con.print(
            "Each column is the same crash: rollcut recovered this home; the others recovered copies made "
            "at the crash (HOME/compare/), one after the other on this machine.",
            soft_wrap=False,
        )
        pace = out["model"].get("pace")
        if pace:
            con.print(f"The local model decodes at the pace of {pace}.", soft_wrap=False)
        base = (out["compared"].get("last_checkpoint") or {}).get("baseline")
        if base:
            had = (
                f"its newest was {base['checkpoint_age_s']} s old at the crash"
                if base["checkpoint_id"]
                else "it had none yet at the crash, so everything unfinished started over"
            )
            con.print(
                f"'last checkpoint only' checkpoints every {base['every_s']} s ({base['why']}): {had}. "
                "rollcut checkpoints every 0.5 s and continues from the stream's sealed tail.",
                soft_wrap=False,
            )
    if out["home"]:
        home = out["home"]
        con.print(f"\n[bold]everything is kept in[/bold] {home}", soft_wrap=True)
        con.print("rows: rollouts.jsonl (NeMo Gym's format); logs/, ledger/, nats/ (the stream); try next:")
        con.print("  # a picture of this collection, one HTML file", style="dim")
        con.print(f"  rollcut report --home {home}", soft_wrap=True, highlight=False)
        if example:
            con.print("  # one rollout that continued, rebuilt from the log", style="dim")
            con.print(f"  rollcut replay --home {home} --rollout {example}", soft_wrap=True, highlight=False)
        con.print("  # the published checkpoints", style="dim")
        con.print(f"  rollcut checkpoints list --home {home}", soft_wrap=True, highlight=False)


def _legend(con: Console, items: list[tuple[str, str]]) -> None:
    for name, meaning in items:
        con.print(f"  [dim]{name}: {meaning}[/dim]")


def _ms(p50: float | None, p99: float | None) -> str:
    return "-" if p50 is None or p99 is None else f"{p50:.0f} / {p99:.0f}"


def _num(v: Any) -> str:
    if v is None:
        return "-"  # not counted: an engine rollcut did not start
    return f"{v:.1f}" if isinstance(v, float) else f"{v:,}"
