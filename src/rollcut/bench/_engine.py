"""``rollcut bench model --backend engine``: custody in front of a real inference engine.

Two measurements on llama.cpp's server (the tiny model, on this machine's CPU), in one run:

- **Latency.** The same chat requests (same messages, same number of tokens: the end token is
  forbidden, so every call generates exactly ``tokens``) sent to the engine's own
  ``/v1/chat/completions`` and to rollcut's model server with the engine backend in front of
  the same engine, alternately, ``repeat`` times, at each client count. Reported: each side's
  p50/p99 and what custody adds (tokenizing through the engine, streaming, the admitted and
  completed events, the token-store write), with spreads.
- **A crash.** ``crash_calls`` long calls in flight, a checkpoint, the model server SIGKILLed
  (the engine lives), the server restarted and every call sent again as the next attempt. Once
  with generation cuts, once with cuts off (running calls ``excluded``: what every upstream
  backend did before). From the engine's own token counter: what it generated before the crash
  (``generated_before_crash``), after it (``generated_after_restart``), what cuts kept
  (``kept_by_cuts``), and so what was generated twice (``regenerated``: after-restart tokens
  minus the ones never generated before).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .._telemetry import percentile
from ..bus import BusConfig, EmbeddedServer, EventLog, ModelCallPrefixCut
from ..gym.model.engine import LlamaServer, tiny_engine
from ..ledger import Ledger
from ..participants import Coordinator
from ..tokens import LocalTokenStore
from ._model import _load, _spawn
from ._spread import spread

__all__ = ["bench_model_engine"]


async def _until(cond: Any, what: str, limit_s: float = 120.0) -> None:
    give_up = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > give_up:
            raise RuntimeError(f"bench model: never {what}")
        await asyncio.sleep(0.01)


async def _all_through(engine: LlamaServer, running: list[Any], at_least: int) -> bool:
    """Whether every call is running ``at_least`` tokens in at once; False the moment one ended
    first. Under a loaded machine's scheduling one call can start after another has finished (the
    tiny model is fast): the scene is then set again, not waited for in vain."""
    give_up = time.monotonic() + 120.0
    while engine.decoding(at_least=at_least) < len(running):
        if any(f.done() for f in running):
            return False
        if time.monotonic() > give_up:
            raise RuntimeError(f"bench model: the calls never ran {at_least} tokens in at once")
        await asyncio.sleep(0.01)
    return True


def _serve(nats: str, ns: str, tokens: Path, engine: LlamaServer, *, cuts: bool) -> tuple[Any, str]:
    argv = [sys.executable, "-m", "rollcut", "serve", "model", "--url", nats, "--namespace", ns]
    argv += ["--tokens", str(tokens), "--port", "0", "--backend", "engine", "--upstream", engine.url]
    return _spawn(argv + ([] if cuts else ["--backend-option", "cuts=false"]))


async def _latency(
    nats: str,
    root: Path,
    engine: LlamaServer,
    eos: int,
    calls: int,
    tokens: int,
    clients: tuple[int, ...],
    repeat: int,
    logprobs: bool = False,
) -> dict[str, Any]:
    ns = f"benchengine{os.urandom(3).hex()}"
    log = await EventLog.connect(BusConfig(url=nats, namespace=ns))
    proc, url = _serve(nats, ns, root / "tokens-latency", engine, cuts=True)
    urls = {"direct": engine.url, "custody": url}
    out: dict[str, Any] = {}
    try:
        run = 0
        for c in clients:
            got: dict[str, list[list[float]]] = {"direct": [], "custody": []}
            for r in range(repeat):
                for name in ("direct", "custody") if r % 2 == 0 else ("custody", "direct"):
                    run += 1
                    rids = [f"e{run}-{i}" for i in range(calls)]
                    bodies = [
                        {
                            "messages": [{"role": "user", "content": f"the call {run}-{i}"}],
                            "max_tokens": tokens,
                            "logit_bias": {str(eos): -100},
                            **({"logprobs": True} if logprobs else {}),
                        }
                        for i in range(calls)
                    ]
                    if name == "custody":
                        for rid in rids:
                            await log.dispatch(rid, {}, instance="bench")
                    one_each = [(rid, [body]) for rid, body in zip(rids, bodies, strict=True)]
                    got[name].append((await _load(urls[name], one_each, c))[0])
            added = {
                p: [
                    (percentile(cl, p, 3) or 0.0) - (percentile(dl, p, 3) or 0.0)
                    for cl, dl in zip(got["custody"], got["direct"], strict=True)
                ]
                for p in (50, 99)
            }
            out[str(c)] = {
                **{
                    f"{name}_p{p}_ms": spread([percentile(lat, p, 3) or 0.0 for lat in got[name]])
                    for name in ("direct", "custody")
                    for p in (50, 99)
                },
                "added_p50_ms": spread(added[50]),
                "added_p99_ms": spread(added[99]),
            }
    finally:
        proc.kill()
        proc.wait()
        await log.close()
    return out


async def _crash(
    nats: str, root: Path, engine: LlamaServer, eos: int, n: int, tokens: int, *, cuts: bool
) -> dict[str, Any]:
    """The crash scene, set at most three times (see :func:`_all_through`); ``tries`` says how
    many it took."""
    for tried in range(1, 4):
        got = await _crash_once(nats, root, engine, eos, n, tokens, cuts=cuts)
        if got is not None:
            return {**got, "tries": tried}
        await _until(engine.idle, "the engine stopped the set-aside scene's requests")
    raise RuntimeError("bench model: in three tries, a call always ended before the rest were in")


async def _crash_once(
    nats: str, root: Path, engine: LlamaServer, eos: int, n: int, tokens: int, *, cuts: bool
) -> dict[str, Any] | None:
    ns = f"benchcrash{os.urandom(3).hex()}"
    log = await EventLog.connect(BusConfig(url=nats, namespace=ns))
    store = root / f"tokens-{ns}"
    body = {"max_tokens": tokens, "logit_bias": {str(eos): -100}}
    rollouts = [f"c{i}" for i in range(n)]

    def request(r: str) -> dict[str, Any]:
        return {**body, "messages": [{"role": "user", "content": f"the long call {r}"}]}

    try:
        with Ledger(root / f"ledger-{ns}") as ledger, LocalTokenStore(store) as ts:
            coord = Coordinator(log, ledger, ts)
            proc, url = _serve(nats, ns, store, engine, cuts=cuts)
            for r in rollouts:
                await log.dispatch(r, {}, instance="bench")
            start = engine.tokens_predicted()
            async with httpx.AsyncClient(base_url=url, timeout=600) as http:
                running = [
                    asyncio.ensure_future(
                        http.post(
                            "/v1/chat/completions",
                            json=request(r),
                            headers={"x-rollout-id": r, "x-rollout-attempt": "1"},
                        )
                    )
                    for r in rollouts
                ]
                try:
                    through = await _all_through(engine, running, tokens // 4)
                    res = await coord.checkpoint(deadline_s=30) if through else None
                finally:
                    proc.kill()  # SIGKILL the model server; the engine lives
                    proc.wait()
                    await asyncio.gather(*running, return_exceptions=True)
            if res is None:
                return None
            await _until(engine.idle, "the engine stopped the dead server's requests")
            before = engine.tokens_predicted() - start
            events = [s.event async for s in log.read(up_to=res.record.cut)]
            kept = sum(e.token_boundary for e in events if isinstance(e, ModelCallPrefixCut))
            proc, url = _serve(nats, ns, store, engine, cuts=cuts)
            try:
                for r in rollouts:
                    await log.supersede(
                        r,
                        1,
                        instance="bench",
                        checkpoint_id=res.record.checkpoint_id,
                        from_cut=res.record.cut,
                    )
                mark = engine.tokens_predicted()
                async with httpx.AsyncClient(base_url=url, timeout=600) as http:
                    answers = await asyncio.gather(
                        *(
                            http.post(
                                "/v1/chat/completions",
                                json=request(r),
                                headers={"x-rollout-id": r, "x-rollout-attempt": "2"},
                            )
                            for r in rollouts
                        )
                    )
                for a in answers:
                    a.raise_for_status()
                after = engine.tokens_predicted() - mark
            finally:
                proc.kill()
                proc.wait()
    finally:
        await log.close()
    never_generated = n * tokens - before  # tokens no attempt had reached before the crash
    return {
        "generated_before_crash": before,
        "kept_by_cuts": kept,
        "generated_after_restart": after,
        "regenerated": after - never_generated,
    }


async def bench_model_engine(
    *,
    calls: int = 64,
    tokens: int = 32,
    clients: tuple[int, ...] = (1, 8),
    repeat: int = 3,
    crash_calls: int = 8,
    crash_tokens: int = 600,
    logprobs: bool = False,
) -> dict[str, Any]:
    """Custody's added latency over calling the engine directly, and tokens regenerated after a crash
    with cuts and without, on llama.cpp's server with the tiny model."""
    with tempfile.TemporaryDirectory(prefix="rollcut-benchengine-") as tmp:
        root = Path(tmp)
        slots = max(8, crash_calls, *clients)
        with EmbeddedServer(root / "nats") as nats, tiny_engine(root / "engine", slots=slots) as engine:
            assert engine.eos_id is not None  # the tiny model's, known to its writer
            eos = engine.eos_id
            latency = await _latency(nats.url, root, engine, eos, calls, tokens, clients, repeat, logprobs)
            with_cuts = await _crash(nats.url, root, engine, eos, crash_calls, crash_tokens, cuts=True)
            excluded = await _crash(nats.url, root, engine, eos, crash_calls, crash_tokens, cuts=False)
    return {
        "engine": "llama.cpp",
        "calls": calls,
        "tokens_per_call": tokens,
        "repeat": repeat,
        "logprobs": logprobs,  # both sides asked for every token's log-prob (llama.cpp's, rollcut's)
        "clients": latency,
        "crash": {
            "calls": crash_calls,
            "tokens_per_call": crash_tokens,
            "cuts": with_cuts,
            "excluded": excluded,
            "regenerated_ratio": round(with_cuts["regenerated"] / max(1, excluded["regenerated"]), 3),
        },
    }
