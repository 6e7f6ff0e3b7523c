"""The reference framework integration: collect rollouts, checkpoint, recover.

Identity: rollout ids are assigned before dispatch (``<task id>-<repeat>``), and
``rollout.dispatched`` holds the original input. The live-execution registry
is the ledger's projection of the log, not a second source of truth.

Hand-off, exactly once: a finished rollout's row is appended to the output
JSONL and fsynced, *then* ``result.accepted`` closes it. A crash between the
two leaves a row without acceptance; on the next run the row is found and only
the acceptance is appended. So every rollout appears in the output exactly
once, across any number of crashes.

Recovery (``resume=True``) is :class:`rollcut.participants.Restorer`'s: each
rollout not yet accepted continues from the cut or starts over from its input.
A continuation the servers refuse (a restart-only environment, a changed agent)
falls back to a fresh dispatch as the next attempt; nothing ever resumes from a
combination of states that do not belong together.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from .._errors import (
    RollcutError,
    RolloutExistsError,
    StaleAttemptError,
    StorageError,
)
from .._telemetry import percentile
from .._tracing import INVOKE_ATTRS, attempt_span, traced
from ..bus import EventLog
from ..gym.wire import ErrorKind, Identity, error_from_response, identity_headers
from ..ledger import Ledger, RolloutIndex
from ..participants import Coordinator, PauseBreakdown, RecoveryMode, Restorer
from ..tokens import TokenStore
from ._buswatch import OUTAGE_FLOOR_S, BusWatch
from ._checkpointing import Checkpointing
from ._config import CollectOptions
from ._handoff import HandOff, refuse_foreign, standing, write_row
from ._lease import DEFAULT_LEASE_TTL_S, NamespaceLease
from ._metrics import CollectorMetrics
from ._recovering import Recovering
from ._routing import Routing
from ._rows import Rows, row_kept
from ._signals import install_signals
from ._summary import CollectorHooks, Summary, summary_dict

__all__ = ["EXIT_REQUEUE", "Collector", "Summary", "summary_dict"]


EXIT_REQUEUE = 75  # EX_TEMPFAIL: a scheduler (Slurm) may requeue the job
"""Exit code after a checkpoint on SIGTERM: requeue the job (EX_TEMPFAIL)."""


class Collector(Checkpointing, Recovering):
    """The reference framework integration: dispatch, hand off exactly once, checkpoint, recover."""

    def __init__(
        self,
        log: EventLog,
        ledger: Ledger,
        tokens: TokenStore,
        options: CollectOptions,
        *,
        tasks: Iterable[dict[str, Any]],
        output: Path,
        task_lines: Iterable[int] | None = None,
        instance: str = "collector-0",
        hooks: CollectorHooks | None = None,
        recovery: RecoveryMode = RecoveryMode.TAIL,
        recovery_checkpoint: str | None = None,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self.options = options
        checkpoint_deadline_s = options.checkpoint.deadline_s
        self.log = log
        self.ledger = ledger
        self.coordinator = Coordinator(log, ledger, tokens)
        self._ck_lock = asyncio.Lock()
        self.checkpoint_ms: list[float] = []  # each published checkpoint, end to end
        self.pause_ms: list[float] = []  # ... and how long it stood the collection still
        self.pauses = PauseBreakdown()  # ... and where that went
        self.restorer = Restorer(
            log,
            ledger,
            self.coordinator,
            instance=instance,
            deadline_s=checkpoint_deadline_s,
            checkpoint_lock=self._ck_lock,
        )
        # which environment server (agent) takes each row, and how many rollouts it makes
        self.routing = Routing(
            options.environment_url.rstrip("/"),
            options.num_repeats,
            {k: v.rstrip("/") for k, v in options.agents.items()},
        )
        self.output = output
        self.concurrency = options.concurrency
        self.max_attempts = options.max_attempts
        self.every_s = options.checkpoint.every_s
        compaction = options.compaction
        self.compact_keep = compaction.keep if compaction.enabled else None  # None: the stream keeps all
        self.release_tokens = compaction.release_tokens
        self.deadline_s = checkpoint_deadline_s
        self.instance = instance
        self.recovery = RecoveryMode(recovery)
        # the checkpoint a resume with RecoveryMode.CHECKPOINT plans from (a baseline's); heals after
        # it plan from the latest, as always
        self._recovery_checkpoint = recovery_checkpoint
        self.hooks = hooks or CollectorHooks()
        self.summary = Summary()
        # the rollouts and the rows written for them live on disk (collect/_index.py): the collector's
        # memory follows the rollouts it is running, not every one it has seen
        self.rows = Rows(tasks, self.routing.repeats, output, lines=task_lines)
        # rollout id -> (its row's digest, its reward): what the acknowledgement binds. Not the row: a
        # row holds the whole episode with its token ids, and a week's rows do not fit in memory
        self._written = self.rows.inputs.written()
        self.hand_off = HandOff(log, instance, self.rows, output, self.summary, self._written)
        self._stop = asyncio.Event()
        self._running = 0
        self._interrupted: set[str] = set()  # runs that broke off, waiting for recovery
        self._heal_lock = asyncio.Lock()
        self._recover_lock = asyncio.Lock()
        self.lease = NamespaceLease(log, instance=instance, ttl_s=lease_ttl_s, on_lost=self._lease_lost)
        self._lost: RollcutError | None = None
        self.heal_timeout_s = options.heal_timeout_s
        # a bus without an answer for this long stops the collection for a requeue (_buswatch.py)
        outage_s = options.bus_outage_s or max(checkpoint_deadline_s, OUTAGE_FLOOR_S)
        self.watch = BusWatch(log, outage_s, self._bus_lost)
        self._collecting: asyncio.Future[Summary] | None = None
        self._working = False  # the workers run: the stop flag reaches them
        self.metrics = CollectorMetrics(self)  # read when scraped (``--metrics-port``)

    @property
    def env_url(self) -> str:
        """The default environment server (every row's, unless its ``agent_ref`` routes it)."""
        return self.routing.environment_url

    @env_url.setter
    def env_url(self, url: str) -> None:  # an environment that moved (a test restarts it elsewhere)
        self.routing = dataclasses.replace(self.routing, environment_url=url.rstrip("/"))

    # --- identity and hand-off ---------------------------------------------------------

    _write_row = staticmethod(write_row)  # the durable row append (collect/_handoff.py)

    def rollout_ids(self) -> list[str]:
        """Every rollout of this collection, in input order."""
        return list(self.rows.inputs)

    def _load_written(self) -> None:
        self._written.clear()
        # every row beyond a rollout's first is a duplicate
        self.summary.duplicate_results = sum(
            not self._written.add(row["rollout_id"], row_kept(row)) for row in self.rows.written()
        )

    async def retire(self, rid: str, reason: str = "") -> None:
        """Give a rollout up: the fence first (every server drops it, its writes are refused), then
        its row, marked ``retired``, so the output still names every rollout exactly once. A rollout
        already handed off is left alone: its result stands."""
        if rid in self._written:
            return
        state = await self.log.retire(rid, instance=self.instance, reason=reason)
        self.hand_off.retired(rid, state.attempt, reason)

    # --- the run -------------------------------------------------------------------------

    def _finished(self, rid: str, rec: RolloutIndex | None) -> bool:
        """Whether a rollout needs no run: its row is written, or the namespace accepted or retired it
        (``rec``: its ledger record)."""
        if rid in self._written:
            return True
        return rec is not None and (rec.accepted_seq is not None or rec.retired_seq is not None)

    async def _dispatch(self, rid: str, rec: RolloutIndex | None) -> None:
        """Dispatch a rollout as it starts (its original input on the log, attempt 1 open), unless an
        earlier run did (``rec``: its ledger record, as :meth:`_finished` read it)."""
        if rec is not None and rec.dispatch_seq:
            return
        with contextlib.suppress(RolloutExistsError):
            await self.log.dispatch(rid, self.rows.inputs[rid].row, instance=self.instance)

    def _broke_off(self, rid: str, kind: str, why: str) -> None:
        """Rollout ``rid``'s run broke off on ``kind``: its failure until it succeeds, and a fault
        counted whether or not it then does."""
        self.summary.failed[rid] = why
        self.summary.faults[kind] = self.summary.faults.get(kind, 0) + 1

    async def _run_one(self, client: httpx.AsyncClient, rid: str) -> None:
        for _ in range(self.max_attempts * 20):
            if self._stop.is_set():
                return
            state = await self.log.fence_state(rid)
            if state is not None and state.retired:
                self.hand_off.retired(rid, state.attempt, "retired while running")
                return
            if state is None or not state.open:
                return
            if state.attempt > self.max_attempts:
                why = f"gave up after {self.max_attempts} attempts"
                self.summary.failed[rid] = why
                self.summary.gave_up.append(rid)
                await self.retire(rid, reason=why)  # for good: fenced off, and its one row written
                return
            try:  # one attempt, one trace (rollcut._tracing): its root span is this call
                with attempt_span(
                    "invoke_agent", self.log.subjects.namespace, rid, state.attempt, attributes=INVOKE_ATTRS
                ):
                    resp = await client.post(
                        f"{self.routing.url(self.rows.inputs[rid].row)}/run",
                        json=self.rows.run_body(rid, state.attempt),
                        headers=identity_headers(Identity(rid, state.attempt)),
                    )
            except httpx.HTTPError as exc:
                if self._stop.is_set():
                    return
                self._broke_off(rid, "environment_unreachable", f"environment unreachable: {exc!r}"[:300])
                if not await self._heal(rid, client):
                    return  # never the same attempt again; `--resume` recovers it later
                continue
            if resp.status_code == 200:
                try:
                    await self.hand_off.result(rid, state.attempt, resp.json())
                except StaleAttemptError:
                    continue
                self.summary.failed.pop(rid, None)
                return
            err = error_from_response(resp)
            if err.needs_fresh_dispatch:
                self.summary.fallbacks_to_fresh += 1
                await self.restorer.next_attempt(rid, from_cut=0, reason=f"continuation refused: {err}")
            elif err.kind is ErrorKind.ADMISSION_CLOSED:
                await asyncio.sleep(err.retry_after_s or 1.0)  # a checkpoint is in progress
            elif err.kind in (ErrorKind.STALE_ATTEMPT, ErrorKind.RETIRED):
                continue  # the fence moved: look at it again
            elif err.kind is ErrorKind.STORAGE_UNAVAILABLE:
                # nothing crashed, so healing cannot help: the bus or a disk is out of room; stop now
                # with the server's reason (exit 74) rather than retry into the full disk
                raise StorageError(
                    f"rollout {rid}: a server could not store its events: {err}", subject=rid
                ) from err
            else:
                self._broke_off(rid, str(err.kind), f"{resp.status_code} {err.kind}: {str(err)[:200]}")
                if not await self._heal(rid, client):
                    return

    async def run(self, *, resume: bool = False) -> Summary:
        """Collect every rollout that has no row yet, holding the namespace's collector lease."""
        await self.lease.acquire()  # before anything is dispatched: a second collector changes nothing
        self.watch.start()
        try:
            summary = await self._watched(resume)
        finally:
            await self.watch.stop()
            if self.watch.outage is None:
                try:
                    await self.lease.release()
                except ConnectionError as exc:  # cut off at the very end: the lease expires by itself
                    self.watch.outage = self.summary.bus_outage = (
                        f"the connection to the bus was lost ({exc!r})"
                    )
                    self.lease.abandon()
            else:
                self.lease.abandon()  # a release would only wait on the bus that is gone
        summary.checkpoint_ms_p50 = percentile(self.checkpoint_ms, 50)
        summary.checkpoint_ms_p99 = percentile(self.checkpoint_ms, 99)
        summary.checkpoint_pause_ms_p50 = percentile(self.pause_ms, 50)
        summary.checkpoint_pause_ms_p99 = percentile(self.pause_ms, 99)
        summary.checkpoint_pause_breakdown = self.pauses.summary()
        if self._lost is not None and self.watch.outage is None:
            raise self._lost
        return summary

    async def _watched(self, resume: bool) -> Summary:
        """The collection, stopped by the bus watch when the bus is gone: before the workers run (a
        recovery waiting on the bus) by cancelling it, after by the stop flag. A failure the outage
        caused is said in the summary; the exit is the outage's."""
        t0 = time.perf_counter()
        self._collecting = asyncio.ensure_future(self._collect(resume, t0))
        try:
            return await self._collecting
        except asyncio.CancelledError:
            if self.watch.outage is None or not self._collecting.cancelled():
                raise
        except RollcutError as exc:
            if self.watch.outage is None:
                raise
            self.summary.failed.setdefault("bus", "; ".join([str(exc), *getattr(exc, "__notes__", [])])[:400])
        except ConnectionError as exc:
            # the bus client's own transport dropped under a call (a partition cut this host off) before
            # the watch had waited out its outage: the same outage, said now (CI: exit 74 "Connection
            # lost" for a host cut off, where the requeue is the answer); the Gym servers' HTTP errors
            # never arrive here raw (httpx wraps them), nor do the rows' disk errors (not connections)
            self._connection_lost(exc)
        self._tally(t0)
        return self.summary

    def _tally(self, t0: float) -> None:
        """The rows written (the output is the truth), the rollouts left without one, the wall time."""
        self._load_written()
        self.summary.results_written = len(self._written)
        self.summary.pending = [rid for rid in self.rows.inputs if rid not in self._written]
        self.summary.wall_s = round(time.perf_counter() - t0, 3)

    def _connection_lost(self, exc: ConnectionError) -> None:
        """The bus client's transport dropped under a call: an outage, said at once (exit 75)."""
        if self.watch.outage is None:
            self.watch.outage = f"the connection to the bus was lost ({exc!r})"
            self._bus_lost(self.watch.outage)
        self.summary.failed.setdefault("bus", repr(exc)[:400])

    def _bus_lost(self, reason: str) -> None:
        self.summary.bus_outage = reason
        self.stop()
        self.log.give_up()  # what still waits on the bus fails now, not after outage_s each
        if self._collecting is not None and not self._working:
            self._collecting.cancel()

    def _lease_lost(self, exc: RollcutError) -> None:
        self._lost = exc
        self._stop.set()

    async def _collect(self, resume: bool, t0: float) -> Summary:
        inputs = self.rows.inputs
        self.summary.rollouts = len(inputs)
        self.rows.claim(self.log.subjects.namespace)
        self._load_written()
        self.summary.torn_bytes_cut = self.rows.torn_bytes
        self.summary.results_written = len(self._written)  # progress counts rows already in the output
        was = await standing(self.log, self.ledger, inputs, self._written)  # one pass over the ledger
        refuse_foreign(self.log, was.foreign)
        for rid in was.unacknowledged:  # a row written, its acknowledgement lost: acknowledge only
            st = await self.log.fence_state(rid)
            if st is not None and st.open:
                await self.hand_off.accept(rid, st.attempt, self._written[rid])
        for rid, attempt in was.rowless:  # retired, its row lost in a crash: write the row only
            self.hand_off.retired(rid, attempt, "retired")
        self.summary.accepted_before = was.completed + was.retired
        if resume:
            await self._recover(was.unfinished)
            # what the recovery did not need to plan, counted as its plan would: the ended ones, and
            # the ones never dispatched before the stop (they start from their input on attempt 1, as
            # the plan's unstarted fresh dispatches do)
            fresh = len(inputs) - was.dispatched
            for kind, n in (
                ("completed", was.completed),
                ("retired", was.retired),
                ("fresh_dispatch", fresh),
            ):
                self.summary.recovery[kind] = self.summary.recovery.get(kind, 0) + n
            self.summary.never_started += fresh
        pending = ((rid, rec) for rid in inputs if not self._finished(rid, rec := self.ledger.rollout(rid)))
        total = len(inputs)
        periodic_done = asyncio.Event()
        periodic = asyncio.ensure_future(self._periodic(periodic_done)) if self.every_s else None
        if self.every_s:  # projection and reference checks keep up between checkpoints
            self.coordinator.validator.start(0.5)  # a round costs a few fsyncs: not more often
        transport = httpx.AsyncHTTPTransport(socket_options=[(6, 1, 1)])  # IPPROTO_TCP, TCP_NODELAY
        async with httpx.AsyncClient(
            timeout=600,
            transport=transport,
            limits=httpx.Limits(max_connections=self.concurrency * 2),
            event_hooks={"request": [traced]},
        ) as client:

            async def worker() -> None:
                while not self._stop.is_set():
                    nxt = next(pending, None)
                    if nxt is None:
                        return
                    rid, rec = nxt
                    self._running += 1
                    try:
                        await self._dispatch(rid, rec)
                        await self._run_one(client, rid)
                    except Exception:
                        self._stop.set()  # a fault stops the collection; run() raises it
                        raise
                    finally:
                        self._running -= 1
                    if self.hooks.progress:
                        self.hooks.progress(self.summary, total, self._running)

            self._working = True
            workers = [asyncio.ensure_future(worker()) for _ in range(self.concurrency)]
            gathered = asyncio.gather(*workers, return_exceptions=True)
            stopper = asyncio.ensure_future(self._stop.wait())
            first: list[asyncio.Future[Any]] = [gathered, stopper]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set():
                for w in workers:
                    w.cancel()  # a worker whose cancel a publish swallowed sees the stop flag instead
            outcomes = await gathered
            stopper.cancel()
        try:
            if periodic is not None:
                periodic_done.set()
                await periodic  # at most one checkpoint in flight, bounded by its deadline
        finally:  # whatever the checkpoints' loop raised, the validator is not left running on the ledger
            await self.coordinator.validator.stop()
        self._tally(t0)
        faults = [o for o in outcomes if isinstance(o, Exception)]
        if faults:  # never swallowed: the first one, with how many there were
            if len(faults) > 1:
                faults[0].add_note(f"{len(faults) - 1} more workers failed too")
            raise faults[0]
        return self.summary

    @property
    def running(self) -> int:
        """Rollouts handed to the environment and not back yet."""
        return self._running

    def stop(self) -> None:
        """Stop dispatching and checkpointing; rollouts running are left to the next ``--resume``."""
        self.summary.interrupted = True
        self._stop.set()

    def install_signals(self) -> None:
        """SIGUSR1 checkpoints; SIGTERM checkpoints, then stops (exit 75), as the options' checkpoint
        policy says: ``_signals``."""
        policy = self.options.checkpoint
        install_signals(self, on_sigusr1=policy.on_sigusr1, on_sigterm=policy.on_sigterm)
