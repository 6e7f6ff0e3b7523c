"""Traces: OpenTelemetry spans in the GenAI conventions, one trace per attempt across processes.

Configured by the standard variables only. With ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, every rollcut process
installs the SDK's tracer provider with a batching OTLP/HTTP exporter;
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*`` are read by
the SDK itself. Unset, nothing is installed: the API's tracer does nothing,
and no header is added anywhere (:data:`enabled` is checked first on every
hot path).

**One attempt, one trace.** An attempt's trace id and its root span's id are
derived from ``(namespace, rollout_id, attempt)``, so whoever starts an
attempt (the collector, or a framework that calls the environment itself)
needs no stored state to link a continued attempt to the attempt it
continues: the link's target is computed, the same in every process and
after every restart. Everything else is ordinary context propagation: W3C
``traceparent`` over HTTP (:func:`inject` on each client, :class:`TraceContext`
on each server) and in NATS message headers (control requests, and every
event appended while a span is current).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import random
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from opentelemetry import context as _context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags

if TYPE_CHECKING:
    from fastapi.telemetry import TelemetryConfig


class _Attempt(Protocol):
    """What names an attempt (``rollcut.gym.wire.Identity``, among others)."""

    @property
    def rollout_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...


__all__ = [
    "CHAT_ATTRS",
    "FASTAPI_TELEMETRY",
    "INVOKE_ATTRS",
    "PROVIDER",
    "TOOL_ATTRS",
    "TRACEPARENT",
    "SpanKind",
    "TraceContext",
    "attempt_span",
    "configure",
    "current",
    "enabled",
    "extract",
    "inject",
    "of_attempt",
    "span",
    "traced",
    "traceparent",
    "tracer",
]

TRACEPARENT = "traceparent"
"""W3C trace context's header, on HTTP requests and NATS messages alike."""
PROVIDER = "rollcut"
"""``gen_ai.provider.name`` on both ends of a model call: rollcut's model server serves the model (its
API is OpenAI's; the engine behind it, llama.cpp or vLLM, is named by ``rollcut.engine``)."""
CHAT_ATTRS = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER}
"""What every ``chat {model}`` span says, client and server."""
TOOL_ATTRS = {"gen_ai.operation.name": "execute_tool"}
"""What every ``execute_tool {name}`` span says."""
INVOKE_ATTRS = {"gen_ai.operation.name": "invoke_agent"}
"""What every ``invoke_agent`` span says (the agent's server adds ``gen_ai.agent.name``)."""
FASTAPI_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""What every rollcut FastAPI app asks of FastAPI's own OpenTelemetry: nothing. rollcut's server spans
are the GenAI ones (one per call, docs/observability.md), its metrics Prometheus'; FastAPI's four
spans per request cost a model call ~0.3 ms of CPU, and with metrics or logs left on it asks the
global providers whether they are configured on every request, reading the environment each time
(4.6% of the model server's busy time under 8 clients, py-spy: docs/performance.md)."""
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SDK_DISABLED = "OTEL_SDK_DISABLED"

enabled = False
"""Whether this process exports spans (set once, by :func:`configure`)."""

_forced: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("rollcut_ids", default=None)


def configure(service: str, instance: str | None = None) -> bool:
    """Install the SDK's tracer provider if the environment asks for export; True if it did.

    ``service`` is the default ``service.name`` (``OTEL_SERVICE_NAME`` wins);
    ``instance`` becomes ``service.instance.id``. Called once per process, as
    it starts (a second call changes nothing)."""
    global enabled
    if enabled or not any(os.environ.get(v) for v in _ENDPOINT_VARS):
        return enabled
    if os.environ.get(_SDK_DISABLED, "").lower() == "true":
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class _AttemptIds(IdGenerator):
        """Random ids, except for an attempt's root span (:func:`attempt_span` sets them)."""

        def generate_span_id(self) -> int:
            forced = _forced.get()
            return forced[1] if forced else random.getrandbits(64) or 1

        def generate_trace_id(self) -> int:
            forced = _forced.get()
            return forced[0] if forced else random.getrandbits(128) or 1

    attrs = {"service.name": service, **({"service.instance.id": instance} if instance else {})}
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over these defaults
    provider = TracerProvider(resource=Resource.create(attrs), id_generator=_AttemptIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    enabled = True
    return True


_TRACER = trace.get_tracer("rollcut")  # the API's proxy: the SDK's tracer once configured, made once


def tracer() -> trace.Tracer:
    """rollcut's tracer (the API's no-op one until :func:`configure` installed the SDK)."""
    return _TRACER


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` to outgoing headers (nothing when not enabled)."""
    if enabled:
        propagate.inject(headers)


async def traced(request: httpx.Request) -> None:
    """An httpx request hook (``event_hooks={"request": [traced]}``): the current span's
    ``traceparent`` goes with the request, so the server's spans join the caller's trace."""
    inject(request.headers)


def traceparent() -> str | None:
    """The current span's ``traceparent`` value, for a message's headers; None when not enabled or
    no span is current."""
    if not enabled:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def current() -> _context.Context | None:
    """The current context, to parent spans started later in another task (None when not enabled)."""
    return _context.get_current() if enabled else None


def extract(headers: Mapping[str, str] | None) -> _context.Context | None:
    """The context an incoming request or message carries; None when not enabled or none came."""
    if not enabled or not headers or TRACEPARENT not in headers:
        return None
    return propagate.extract(headers)


def of_attempt(ident: _Attempt) -> dict[str, Any]:
    """rollcut's own attributes of an attempt, on every span that serves one."""
    return {"rollcut.rollout_id": ident.rollout_id, "rollcut.attempt": ident.attempt}


def _kept(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}


@contextlib.contextmanager
def span(
    name: str,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    parent: _context.Context | None = None,
) -> Iterator[Span]:
    """A span made current for the block (under ``parent``, a context :func:`extract` read, if
    given); attributes whose value is None are left out. An error that leaves the block is
    recorded on the span, which ends with status ERROR. Not enabled, nothing is made or attached:
    the block gets the API's invalid span (every call on it does nothing), at the cost of a flag."""
    if not enabled:
        yield trace.INVALID_SPAN
        return
    with tracer().start_as_current_span(name, parent, kind, _kept(attributes)) as s:
        yield s


def _attempt_ids(namespace: str, rollout_id: str, attempt: int) -> tuple[int, int]:
    digest = hashlib.blake2b(f"{namespace}\0{rollout_id}\0{attempt}".encode(), digest_size=24).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


@contextlib.contextmanager
def attempt_span(
    name: str,
    namespace: str,
    rollout_id: str,
    attempt: int,
    kind: SpanKind = SpanKind.CLIENT,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """The root span of one attempt: its ids derived from the attempt (a new trace, whatever is
    current), linked to the root of the attempt before it when there is one."""
    if not enabled:
        yield trace.INVALID_SPAN
        return
    links = []
    if attempt > 1:
        trace_id, span_id = _attempt_ids(namespace, rollout_id, attempt - 1)
        before = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        links.append(Link(before, {"rollcut.link": "continues", "rollcut.attempt": attempt - 1}))
    attrs = {"rollcut.rollout_id": rollout_id, "rollcut.attempt": attempt, **_kept(attributes)}
    token = _forced.set(_attempt_ids(namespace, rollout_id, attempt))
    try:
        s = tracer().start_span(name, context=_context.Context(), kind=kind, attributes=attrs, links=links)
    finally:
        _forced.reset(token)
    with trace.use_span(s, end_on_exit=True):
        yield s


class TraceContext:
    """ASGI middleware: a request's ``traceparent`` becomes the context its handler runs in, so the
    spans a server starts hang under the caller's. Costs one flag check when not enabled."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not enabled or scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        ctx = extract(headers)
        if ctx is None:
            await self.app(scope, receive, send)
            return
        token = _context.attach(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            _context.detach(token)
