"""The opaque agent's /run: start the agent's own program, pointed at the relay, and verify its answer.

rollcut cannot see inside such an agent (a CLI coding agent, a harness in its
own process tree, a third-party framework), so it runs it as a program: the
task as JSON on stdin; ``OPENAI_BASE_URL`` and ``ROLLCUT_TOOLS_URL`` pointing at
the relay with the rollout's identity in the path (nothing else of rollcut's
environment is passed on: no bus URL, no credentials); its answer as the last
JSON line on stdout (``{"answer": ...}``, more fields allowed). Around it the
launcher does what a Gym agent does: claim the attempt, seed the tool session,
verify the answer and close the session.

What a continued attempt gets depends on what the runtime declared
(``--capability``, see :class:`Capability`): ``replayable_egress`` replays the
lineage's journal to the restarted program; ``sandbox_snapshot`` also restores
the agent's sandbox through a :class:`SandboxSnapshot` provider first (the built-in
one, ``--sandbox DIR-TEMPLATE``, snapshots its working directory); anything
else (``restart_only``, or nothing declared) is refused as ``fresh_dispatch``:
the rollout starts over from its input. Fail closed: side effects outside the
relay (its files, its subprocesses, its own network) are invisible to rollcut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import httpx

from ..._errors import ConfigError, RollcutError
from ..._process import lifeline, sweep_dead_dirs
from ..._tracing import INVOKE_ATTRS, SpanKind, of_attempt, span
from ...bus import AgentSandbox, EventLog, RelayExchange
from ...participants import Participant, PrepareReport
from ...replay import AttemptViews, JournalGap
from ...sandbox._isolation import SANDBOX_PORT, Isolation
from .._attempts import FreshDispatchNeeded, claim_attempt, post_waiting, view_of
from .._capability import Capability, DivergencePolicy
from .._normalise import Normalise
from .._stats import LAUNCHER_STATS, tally
from .._tasks import check_task
from .._writes import append_or_refuse, envelope
from ..wire import ErrorKind, GymError, Identity
from ._exchange import NG_ROW_KEY, RelayRun, answer_response, model_calls
from ._program import MAX_ANSWER_BYTES, STDERR_TAIL, answer_of, read_capped
from ._relay import Relay

__all__ = ["MAX_AGENT_RESTARTS", "OpaqueAgent", "SandboxRef", "SandboxSnapshot"]

MAX_AGENT_RESTARTS = 3
"""How often an attempt's agent killed by a signal is started again in place before the run fails."""


class SandboxRef(NamedTuple):
    """A snapshot as its provider names it: what the launcher logs (``agent.sandbox``)."""

    ref: str
    files: int = 0
    bytes: int = 0


@runtime_checkable
class SandboxSnapshot(Protocol):
    """What a ``sandbox_snapshot`` provider does (the built-in ``tree``; a container or VM
    snapshotter through the ``rollcut.sandboxes`` entry point group)."""

    name: str
    """The provider's name, logged with each snapshot."""

    def bind(self, log: EventLog) -> None:
        """The worker's log: where its store lives (called once, before anything else)."""
        ...

    def workdir(self, ident: Identity) -> Path | None:
        """Where the attempt's program runs (made if missing); None: the launcher's own choice."""
        ...

    async def snapshot(self, ident: Identity, checkpoint_id: str) -> SandboxRef:
        """At a checkpoint's prepare: make the sandbox of ``ident`` durable, as of now."""
        ...

    async def restore(self, ident: Identity, record: AgentSandbox) -> None:
        """Before a continued attempt starts: its sandbox as ``record`` (the lineage's last snapshot
        at its cut) names it. Raises when it cannot: the rollout then starts over."""
        ...

    def close(self, ident: Identity) -> None:
        """The attempt is over, or starts from its input: what its sandbox holds goes."""
        ...


class OpaqueAgent:
    """Runs an opaque agent program per attempt, behind a journaling :class:`Relay`."""

    def __init__(
        self,
        log: EventLog,
        *,
        instance: str,
        command: list[str],
        relay_url: str,
        model_url: str,
        resources: dict[str, str],
        http: httpx.AsyncClient,
        participant: Participant | None = None,
        capability: Capability = Capability.RESTART_ONLY,
        on_divergence: DivergencePolicy = "fresh_dispatch",
        sandbox: SandboxSnapshot | None = None,
        admission_wait_s: float = 120.0,
        run_timeout_s: float | None = None,
        isolation: Isolation | None = None,
        relay_socket: Path | None = None,
        normalise: Normalise | None = None,
    ) -> None:
        if not command:
            raise ConfigError("an opaque agent needs the command that starts it (--command)")
        if capability is Capability.SANDBOX_SNAPSHOT and sandbox is None:
            raise ConfigError("capability sandbox_snapshot needs a sandbox provider (--sandbox DIR-TEMPLATE)")
        self.log, self.instance, self.command = log, instance, command
        if sandbox is not None:
            sandbox.bind(log)
        self.relay_url = relay_url.rstrip("/")
        self.resources = {k: v.rstrip("/") for k, v in resources.items()}
        self.http, self.participant = http, participant
        self.capability, self.sandbox = capability, sandbox
        self.admission_wait_s = admission_wait_s
        self.run_timeout_s = run_timeout_s
        if isolation is not None and relay_socket is None:
            raise ConfigError("a sandboxed agent reaches its relay over a Unix socket: give relay_socket")
        self.isolation, self.relay_socket = isolation, relay_socket
        sweep_dead_dirs("rollcut-agent-")
        self.views = AttemptViews(log)  # what each continued attempt replays, read once
        self.relay = Relay(
            log,
            instance=instance,
            model_url=model_url,
            resources=resources,
            http=http,
            participant=participant,
            on_divergence=on_divergence,
            admission_wait_s=admission_wait_s,
            normalise=normalise,
        )
        self.stats = tally(LAUNCHER_STATS)

    # --- participant hooks: the relay's, plus the sandbox's snapshot -----------------------

    async def prepare(self, checkpoint_id: str) -> PrepareReport:
        report = await self.relay.prepare(checkpoint_id)
        if self.sandbox is not None:  # after the relay's: the journal each snapshot goes with is settled
            sandbox = self.sandbox  # every run's at once: the prepare, and the pause, wait for them all
            runs = list(self.relay.runs.items())
            await asyncio.gather(
                *(self._snapshot(sandbox, ident, len(run.journal), checkpoint_id) for ident, run in runs)
            )
        return report

    async def _snapshot(self, sandbox: SandboxSnapshot, ident: Identity, exchanges: int, ck: str) -> None:
        """One run's sandbox made durable and logged. One that cannot be (a file vanished under the
        scan, a tree over its bounds) is left without a record at this cut: its continuation fails
        closed, and the checkpoint goes on for every other rollout."""
        try:
            ref = await sandbox.snapshot(ident, ck)
        except (RollcutError, OSError) as exc:
            self.stats.inc("sandbox_snapshots_failed")
            print(
                f"{ident.rollout_id}/{ident.attempt}: its sandbox was not snapshotted: {exc}", file=sys.stderr
            )
            return
        event = AgentSandbox(
            **envelope("agent", self.instance, ident),
            provider=sandbox.name,
            checkpoint_id=ck,
            ref=ref.ref,
            exchanges=exchanges,
            files=ref.files,
            bytes=ref.bytes,
        )
        with contextlib.suppress(GymError):  # a fenced-off attempt: its rollout is someone else's now
            await append_or_refuse(self.log, event)
            self.stats.inc("sandboxes_snapshotted")

    def release(self, checkpoint_id: str) -> None:
        self.relay.release(checkpoint_id)

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None  # each continued run reads its journal from the log

    def retire(self, rollout_id: str, reason: str) -> None:
        """A retired rollout's agent is stopped; its /run answers 409 ``retired``."""
        if reason == "accepted":
            return
        for run in list(self.relay.runs.values()):
            if run.ident.rollout_id == rollout_id:
                run.stop(f"{rollout_id} was retired: {reason}", ErrorKind.RETIRED)

    # --- /run ------------------------------------------------------------------------------

    async def _post(self, url: str, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = (
            await post_waiting(self.http, url, ident, body, wait_s=self.admission_wait_s)
        ).json()
        return answer

    async def run(self, ident: Identity, task: dict[str, Any]) -> dict[str, Any]:
        check_task(task, list(self.resources))
        await claim_attempt(self.log, self.instance, ident, running_here=ident in self.relay.runs)
        self.stats.inc("runs_started")
        attrs = {**INVOKE_ATTRS, "gen_ai.agent.name": "opaque", **of_attempt(ident)}
        try:
            with span("invoke_agent opaque", SpanKind.SERVER, attrs):  # its requests go out through the relay
                return await self._run(ident, task)
        except FreshDispatchNeeded:
            self.stats.inc("fresh_dispatch")
            raise
        except GymError as exc:
            self.stats.inc("runs_retired", exc.kind is ErrorKind.RETIRED)
            raise

    async def _journal(self, ident: Identity) -> list[RelayExchange]:
        """The journal a continued attempt replays; a fresh one has none. Refused as fresh_dispatch
        when the runtime did not declare that a replay reproduces the agent."""
        view = await view_of(self.views, ident)
        if not view.continued:
            if self.sandbox is not None:
                self.sandbox.close(ident)  # from its input: nothing an earlier attempt left
            return []
        if self.capability is Capability.RESTART_ONLY:
            raise FreshDispatchNeeded(
                f"{ident.rollout_id}: this agent declares restart_only (no replayable egress), "
                "so a cut-off rollout starts over from its input"
            )
        try:
            journal = view.journal()
        except JournalGap as exc:
            raise FreshDispatchNeeded(str(exc)) from exc
        if self.sandbox is not None:
            await self._restore(self.sandbox, ident, view.sandbox, len(journal))
        return journal

    async def _restore(
        self, sandbox: SandboxSnapshot, ident: Identity, record: AgentSandbox | None, exchanges: int
    ) -> None:
        """The sandbox as the cut had it, or the rollout starts over: files and journal must be of
        one moment (a snapshot taken with as many exchanges journaled as the cut holds)."""
        sandbox.close(ident)
        if record is None and exchanges == 0:
            return  # cut before the program did anything the relay saw: it starts from an empty sandbox
        if record is None or record.exchanges != exchanges or record.provider != sandbox.name:
            raise FreshDispatchNeeded(
                f"{ident.rollout_id}: no {sandbox.name} sandbox snapshot at the cut goes with its "
                f"{exchanges} journaled exchanges, so it starts over from its input"
            )
        try:
            await sandbox.restore(ident, record)
        except (RollcutError, OSError) as exc:
            sandbox.close(ident)
            raise FreshDispatchNeeded(f"{ident.rollout_id}: its sandbox does not restore: {exc}") from exc
        self.stats.inc("sandboxes_restored")

    async def _run(self, ident: Identity, task: dict[str, Any]) -> dict[str, Any]:
        nemo = NG_ROW_KEY in task  # a NeMo Gym row: seeded, verified and answered in NeMo Gym's shapes
        env = str(task.get("env") or next(iter(self.resources)))  # check_task: a row without one has one
        res = self.resources[env]
        journal = await self._journal(ident)
        continued = bool(journal)  # the run's journal grows with what it does live
        await self._post(f"{res}/seed_session", ident, task if nemo else task.get("seed", {}))
        run = self.relay.open(ident, env, journal)
        self.stats.inc("runs_replayed", continued)
        try:
            code, out, err = await self._agent(ident, env, task, run)
        finally:
            self.relay.close(ident)
            if self.sandbox is not None:
                self.sandbox.close(ident)
        if code != 0:
            self.stats.inc("runs_failed")
            # the server's log (0600) keeps what the agent said; the answer quotes its end
            print(f"{ident.rollout_id}/{ident.attempt}: the agent exited with {code}:", err, file=sys.stderr)
            raise GymError(ErrorKind.AGENT_FAILED, f"the agent exited with {code}: {err}")
        result = answer_of(out)
        answer = str(result.get("answer", ""))
        # the transcript is the relay's journal, not the row's Response: the arrays are the store's
        calls = {"model_calls": model_calls(run.journal), "transcript": "journal"}
        own = {"continued": continued, "agent": result, "rollcut": calls}
        if nemo:  # NeMo Gym's /run answers its /verify response: the row, the Response, the reward
            body = {**task, "response": answer_response(ident, task, answer)}
            verdict = await self._post(f"{res}/verify", ident, body)
            await self._post(f"{res}/close_session", ident, {})
            self.stats.inc("runs_finished")
            return {**verdict, **own}
        verdict = await self._post(f"{res}/verify", ident, {**task.get("verify", {}), "answer": answer})
        await self._post(f"{res}/close_session", ident, {})
        self.stats.inc("runs_finished")
        return {
            "reward": verdict.get("reward", 0.0),
            "verified": verdict,
            "turns": result.get("turns", 0),
            "answer": answer,
            "continued": continued,
            "agent": result,
            "rollcut": {"model_calls": model_calls(run.journal)},  # a trainer's way to the token arrays
        }

    async def _agent(
        self, ident: Identity, env: str, task: dict[str, Any], run: RelayRun
    ) -> tuple[int, bytes, str]:
        """The agent's program to its end. Killed by a signal (the OOM killer, a segfault, an operator),
        it is started again within the attempt from its input, answered from the journal, this
        attempt's own exchanges included: nothing it did runs twice."""
        for restarts in range(MAX_AGENT_RESTARTS + 1):
            run.check()  # stopped meanwhile (retired while the last one settled): not started again
            code, out, err = await self._spawn(ident, env, task, run)
            run.check()  # a divergence or a retirement stopped it: that is the answer, not its exit
            if code >= 0 or self.capability is Capability.RESTART_ONLY or restarts == MAX_AGENT_RESTARTS:
                break
            await run.settle()  # what it had sent upstream is journaled first (or failed)
            run.rewind()
            self.stats.inc("agent_restarts")
            print(f"{ident.rollout_id}/{ident.attempt}: the agent died ({code}); again", file=sys.stderr)
        return code, out, err

    async def _spawn(
        self, ident: Identity, env: str, task: dict[str, Any], run: RelayRun
    ) -> tuple[int, bytes, str]:
        """Run the agent's program to its end; its exit code, stdout and stderr's tail."""
        with contextlib.ExitStack() as cleanup:
            argv, child_env, cwd = self._sandboxed(ident, env, run, cleanup)
            code, out, err = await self._exec(argv, child_env, task, run, cwd)
        if self.isolation is not None and code > 128:
            code = 128 - code  # killed by a signal inside the sandbox: as a signal, so it is started again
        return code, out, err

    def _sandboxed(
        self, ident: Identity, env: str, run: RelayRun, cleanup: contextlib.ExitStack
    ) -> tuple[list[str], dict[str, str], Path | None]:
        """The command line and environment of one run of the program: its base URLs carry its
        attempt and its run's token; sandboxed, it reaches the relay through its own loopback."""
        path = f"/r/{ident.rollout_id}/{ident.attempt}/{run.token}"
        own = self.sandbox.workdir(ident) if self.sandbox is not None else None
        if self.isolation is None or self.relay_socket is None:
            child_env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLCUT_", "NATS_"))}
            base, argv = f"{self.relay_url}{path}", list(self.command)
        else:
            # named for this process: what a SIGKILLed worker left, the next agent worker removes
            made = tempfile.TemporaryDirectory(prefix=f"rollcut-agent-{os.getpid()}-")
            workdir = own or Path(cleanup.enter_context(made))
            os.chmod(workdir, 0o700)
            argv = self.isolation.argv(self.command, socket=self.relay_socket, workdir=workdir)
            base, child_env = f"http://127.0.0.1:{SANDBOX_PORT}{path}", {}
        urls = {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": "rollcut-relay",  # the token is in the path: the SDK's key is not checked
            "ANTHROPIC_BASE_URL": base,  # Anthropic's clients append /v1/messages themselves
            "ANTHROPIC_API_KEY": "rollcut-relay",
            "ROLLCUT_TOOLS_URL": f"{base}/tools/{env}",
        }
        if self.isolation is not None:
            return argv, Isolation.environment(urls), None
        return argv, {**child_env, **urls}, own

    async def _exec(
        self,
        argv: list[str],
        child_env: dict[str, str],
        task: dict[str, Any],
        run: RelayRun,
        cwd: Path | None = None,
    ) -> tuple[int, bytes, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env,
            preexec_fn=lifeline(),  # a left-over agent must not outlive its attempt
        )

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

        run.kill = kill  # a divergence or a retirement stops it where it is
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write(json.dumps(task).encode())
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            proc.stdin.close()
            ended = asyncio.gather(
                read_capped(proc.stdout, MAX_ANSWER_BYTES),
                read_capped(proc.stderr, STDERR_TAIL, tail=True),
                proc.wait(),
            )
            try:
                out, err, code = await asyncio.wait_for(ended, self.run_timeout_s)
            except TimeoutError:
                self.stats.inc("runs_timed_out")
                why = f"the agent ran over its {self.run_timeout_s:g} s (--run-timeout) and was stopped"
                raise GymError(ErrorKind.AGENT_FAILED, why) from None
        finally:
            run.kill = None
            if proc.returncode is None:  # the run was cancelled (the framework went away): so is the agent
                kill()
                await proc.wait()
        return code, out, err.decode(errors="replace")
