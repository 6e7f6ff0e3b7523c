"""The local model's pace (one decode loop every call shares, as a batched engine's) and its token
count (a file's length, kept by a SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollcut import ConfigError
from rollcut.gym._options import ModelServe
from rollcut.gym.model import BACKENDS, GEMMA_ON_TWO_CORES, LocalBackend, Pace, TokenTally

from ..helpers import until

_BODY = {"messages": [{"role": "user", "content": "say something long"}]}


async def _drain(backend: LocalBackend, start: int = 0) -> list[int]:
    plan = backend.plan(_BODY)
    return [t async for t in backend.generate(plan, start=start)]


def test_calls_decoding_together_share_each_step_as_a_batched_engine_does() -> None:
    async def go() -> tuple[int, int, list[list[int]]]:
        pace = Pace(0.0005, 0.0001)
        backend = LocalBackend(pace=pace)
        n = len(backend.plan(_BODY).output_ids)
        outs = await asyncio.gather(*(_drain(backend) for _ in range(4)))
        return n, pace.steps, outs

    n, steps, outs = asyncio.run(go())
    assert steps == n  # four sequences, one step per token for all of them, not four
    assert all(o == outs[0] for o in outs) and len(outs[0]) == n


def test_the_demos_pace_is_the_measured_throughput_it_states() -> None:
    p = GEMMA_ON_TWO_CORES
    for batch, measured in ((1, 65), (8, 154), (32, 190)):  # tokens/s, as the profile's text says
        assert abs(p.tokens_per_s(batch) - measured) / measured < 0.06, batch
        assert f"{measured} " in p.what


def test_the_tally_counts_every_token_generated_and_only_those(tmp_path: Path) -> None:
    count = tmp_path / "generated.tokens"
    tally = TokenTally(count)
    backend = LocalBackend(tally=tally)
    whole = asyncio.run(_drain(backend))
    rest = asyncio.run(_drain(backend, start=5))  # a continuation generates only past its prefix
    tally.close()
    assert TokenTally.read(count) == len(whole) + len(rest) == 2 * len(whole) - 5
    assert count.stat().st_mode & 0o777 == 0o600
    assert TokenTally.read(tmp_path / "none") == 0


def test_the_server_options_make_a_paced_counting_backend(tmp_path: Path) -> None:
    opts = ModelServe(
        url="nats://h:1",
        namespace="n",
        credentials="/c.json",
        tokens=str(tmp_path / "t"),
        backend_options={"step_ms": "2", "per_sequence_ms": "0.5", "count_tokens": str(tmp_path / "c")},
    )
    backend = BACKENDS["local"](opts)
    assert isinstance(backend, LocalBackend) and backend.pace is not None and backend.tally is not None
    assert (backend.pace.step_s, backend.pace.per_sequence_s) == (0.002, 0.0005)


_GENERATOR = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from rollcut.gym.model import LocalBackend, Pace, TokenTally

    async def main():
        backend = LocalBackend(pace=Pace(0.01, 0.0), tally=TokenTally(Path(sys.argv[1])))
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 100000}
        while True:
            async for _ in backend.generate(backend.plan(body)):
                pass

    asyncio.run(main())
    """
)


def test_what_a_killed_generator_made_stays_counted(tmp_path: Path) -> None:
    count = tmp_path / "generated.tokens"
    proc = subprocess.Popen([sys.executable, "-c", _GENERATOR, str(count)])
    try:

        def twenty() -> bool:
            assert proc.poll() is None, "the generator died by itself"
            return TokenTally.read(count) >= 20

        asyncio.run(until(twenty, what="20 tokens generated", timeout=60))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        at_kill = TokenTally.read(count)
        assert at_kill >= 20 and TokenTally.read(count) == at_kill  # nothing lost, nothing after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("bad", [{"step_ms": "fast"}, {"count": "x"}])
def test_a_bad_pace_option_is_refused_by_name(tmp_path: Path, bad: dict[str, str]) -> None:
    opts = ModelServe(
        url="nats://h:1", namespace="n", credentials="/c.json", tokens=str(tmp_path), backend_options=bad
    )
    with pytest.raises(ConfigError, match="per_sequence_ms"):
        BACKENDS["local"].check(opts)  # type: ignore[attr-defined]
