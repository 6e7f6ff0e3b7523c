"""The demo's workload options, declared once: ``rollcut demo`` runs it and ``rollcut bench e2e``
measures it, so a seed, an agent or a model means the same in both and is refused the same way."""

from __future__ import annotations

from typing import Annotated

import typer

from ._target import fail

__all__ = [
    "AGENTS",
    "BENCH_ROLLOUTS",
    "DEMO_ROLLOUTS",
    "REAL_MODEL_ROLLOUTS",
    "AgentOpt",
    "BenchRolloutsOpt",
    "DemoRolloutsOpt",
    "ModelOpt",
    "SeedOpt",
    "refuse_workload",
    "rollouts_of",
]

AGENTS = ("simple", "opaque")

REAL_MODEL_ROLLOUTS = 8
"""Rollouts of the demo's workload on a real model when none are asked for (Gemma on two cores:
minutes, where the local model's count would take most of an hour)."""

DEMO_ROLLOUTS = 32  # the demo's own count on the local model: minutes, with its crash and comparisons
BENCH_ROLLOUTS = 64  # bench e2e's: enough rollouts in flight for its pause and throughput figures
_ON_REAL = f"{REAL_MODEL_ROLLOUTS} on a real model"

DemoRolloutsOpt = Annotated[
    int | None,
    typer.Option(help=f"Rollouts to collect (bundled tasks; default {DEMO_ROLLOUTS}, {_ON_REAL})."),
]
BenchRolloutsOpt = Annotated[
    int | None, typer.Option(help=f"Rollouts (default {BENCH_ROLLOUTS}; {_ON_REAL}).")
]
SeedOpt = Annotated[int, typer.Option(help="Seed of the task set and the local model.")]
AgentOpt = Annotated[
    str,
    typer.Option(
        "--agent",
        help="simple (the Simple Agent), or opaque: the reference opaque agent, a program of its own behind "
        "the journaling relay, continued by replaying its journal (docs/opaque-agents.md).",
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help="The model llama.cpp's server runs (with --engine llama.cpp): tiny (written per run) or a "
        "named one (gemma-3-270m: `rollcut engine model gemma-3-270m` first; Gemma's terms apply).",
    ),
]


def refuse_workload(*, engine: str | None, agent: str, model: str) -> None:
    """Refuses an agent or a model the workload does not have, before anything starts."""
    from ..gym.model.engine import ENGINE_MODELS

    if agent not in AGENTS:
        raise fail(f"--agent {agent!r}: {' or '.join(AGENTS)}")
    if model not in ENGINE_MODELS:
        raise fail(f"unknown --model {model!r}; have: {', '.join(ENGINE_MODELS)}")
    if model != "tiny" and engine != "llama.cpp":
        raise fail("--model names what llama.cpp's server runs: add --engine llama.cpp")


def rollouts_of(rollouts: int | None, model: str, *, local: int) -> int:
    """The rollouts asked for, else ``local`` on the local model (:data:`DEMO_ROLLOUTS` or
    :data:`BENCH_ROLLOUTS`, as the command's option says) and :data:`REAL_MODEL_ROLLOUTS` on a real
    one."""
    return rollouts or (local if model == "tiny" else REAL_MODEL_ROLLOUTS)
