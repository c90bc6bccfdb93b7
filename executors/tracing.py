"""OpenTelemetry traces of requests, across the gateway and the executors (docs/operations.md).

Off by default. ``ClusterConfig(tracing=TracingConfig(...))`` turns it on for a local
cluster: the supervisor starts the gateway and the executors with ``FLOWSERVE_TRACING``
(this config as JSON) in their environment, and each process calls ``setup_from_env`` at
start. A process started some other way (a pod) traces when it has that variable. The
SDK's own ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
``OTEL_BSP_SCHEDULE_DELAY``, ...) apply as usual.

What a trace holds: the gateway's span of the request (continuing the W3C ``traceparent``
the client sent, if any), and a child of it for each stage run on an executor (its
executor, batch size, queue wait; a race's copies marked won, lost or cancelled; a hedge's
backup), and under a run, its prediction-cache and KVS lookups. A run that serves a
batch of requests has one span, in the first request's trace, linking every request it
serves. The request span's context travels to the executors as ``tp`` in the run
messages (executors/wire/messages.py), a traceparent string; executors record spans only
for sampled ones.

Why module globals: with tracing off, ``tracer`` is None and each hook on the data path is
one test of it (nothing here imports an opentelemetry module before ``setup``); the cost
with it off, at 1 % and at 100 % is measured in benchmarks/README.md ("Tracing").
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass
from typing import Any

from flow.configuration import Config, Number, Str, setting
from flow.errors import NotInstalledError

log = logging.getLogger("flowserve.tracing")

ENV = "FLOWSERVE_TRACING"  # the TracingConfig JSON a process traces with (unset: off)
HEADER = "traceparent"  # W3C trace context, in a request's and its answer's headers
TRACE_ID_HEADER = "x-trace-id"  # the answer's trace id alone, for people and logs
SCOPE = "flowserve"

#: the process's Tracer while tracing is on; None: off (the hooks test this and nothing else)
tracer: Any = None
_provider: Any = None
_ratio = 1.0  # the share of requests without a caller's decision that the gateway records
_random = random.Random()
_ODD = frozenset("13579bdf")  # a traceparent's last hex digit when its sampled flag is set


def _url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


@dataclass(frozen=True)
class TracingConfig(Config):
    """Where traces go and how many requests are traced.

    endpoint: the OTLP/HTTP traces URL spans are exported to (e.g.
        ``http://collector:4318/v1/traces``). None: the SDK's
        ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``), else
        ``http://localhost:4318/v1/traces``.
    sample_ratio: the share of requests traced, drawn at random at the gateway (default
        1.0: all). A request that comes with a ``traceparent`` keeps its caller's decision
        (its sampled flag), whatever the ratio: a trace is whole or absent.
    """

    endpoint: str | None = setting(None, Str("an http:// or https:// URL", _url, optional=True))
    sample_ratio: float = setting(1.0, Number(ge=0, le=1))

    def env(self) -> dict[str, str]:
        """What a child process is started with to trace as this config says."""
        return {ENV: json.dumps(self.to_json())}


# -- setting up ---------------------------------------------------------------------------------


def setup(config: TracingConfig | None, service: str, instance: str | None = None) -> None:
    """Trace this process's requests as ``config`` says (None: off), its spans exported
    from a background thread (the SDK's BatchSpanProcessor) as ``service``."""
    global tracer, _provider, _ratio
    if config is None:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
    except ImportError as e:
        raise NotInstalledError(
            f"tracing is on ({ENV} or ClusterConfig.tracing) but the OpenTelemetry packages are missing "
            f"({e.name}): pip install 'flowserve[tracing]'"
        ) from None
    attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or service}
    if instance is not None:
        attributes["service.instance.id"] = instance
    # the gateway draws the ratio itself (_unsampled) before it asks the SDK for a span; the
    # SDK then records what comes to it (a root: always; a continued trace: as its parent says)
    _ratio = config.sample_ratio
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON), resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint)))
    trace.set_tracer_provider(provider)  # an operator's own spans join the run's trace
    _provider = provider
    tracer = provider.get_tracer(SCOPE)
    from kvs import cache  # the store's lookups: spans while a run is traced

    cache.lookup_trace = child
    log.info("tracing on: %s, sampling %g of requests", config.endpoint or "the OTEL_* endpoint", config.sample_ratio)


def setup_from_env(service: str, instance: str | None = None, environ=None) -> None:
    """``setup`` with the config in ``FLOWSERVE_TRACING`` (absent or empty: off)."""
    text = (os.environ if environ is None else environ).get(ENV)
    if text:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise TracingConfig.error(f"{ENV} must be a TracingConfig as JSON, got {text!r}: {e}") from None
        setup(TracingConfig.from_json(doc), service, instance)


def shutdown() -> None:
    """Export what is buffered and stop (the SDK also does this at a normal exit)."""
    global tracer, _provider
    provider, _provider, tracer = _provider, None, None
    if provider is not None:
        from kvs import cache

        cache.lookup_trace = None
        provider.shutdown()


# -- trace context as text ---------------------------------------------------------------------


def sampled(tp: str) -> bool:
    """True if traceparent ``tp`` (or "": none) says its trace is recorded."""
    return bool(tp) and tp[-1] in _ODD


def trace_id(tp: str) -> str:
    """The trace id (32 hex digits) of traceparent ``tp``; "" for none."""
    return tp[3:35] if len(tp) >= 55 else ""


def log_tag(tp: str) -> str:
    """What a log line about a request adds to name its trace: " trace <id>", or ""."""
    return f" trace {tp[3:35]}" if len(tp) >= 55 else ""


def _traceparent(ctx) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _context(tp: str):
    """The remote span context a traceparent names, as an OpenTelemetry Context."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({HEADER: tp})


def _span_context(tp: str):
    from opentelemetry import trace

    return trace.get_current_span(_context(tp)).get_span_context()


# -- the gateway --------------------------------------------------------------------------------


class _Unrecorded:
    """The span of a request that is not sampled: its ids (the answer and the log lines
    name its trace all the same), and the span methods the gateway calls, doing nothing.
    Why not the SDK's own non-recording span: at a 1 % ratio, 99 % of requests take this
    path, and the SDK's costs ~20 us a request at the gateway, this one ~2."""

    __slots__ = ("trace_id", "span_id", "trace_flags", "is_valid")

    def __init__(self, trace_id: int, span_id: int, flags: int):
        self.trace_id, self.span_id, self.trace_flags, self.is_valid = trace_id, span_id, flags, True

    def get_span_context(self) -> _Unrecorded:
        return self

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, *_args) -> None:
        pass

    set_status = add_event = record_exception = end = set_attribute


def _unsampled(headers: dict[str, str]) -> _Unrecorded | None:
    """A request the gateway does not record: ids of its own, in the caller's trace if it
    sent one whose sampled flag is clear; None when the SDK decides (a sampled caller, or no
    caller and the ratio's draw)."""
    given = headers.get(HEADER)
    if given is None:
        if _ratio >= 1.0 or _random.random() < _ratio:
            return None
        return _Unrecorded(_random.getrandbits(128) or 1, _random.getrandbits(64) or 1, 0)
    parts = given.strip().split("-")
    if len(parts) >= 4 and len(parts[1]) == 32 and len(parts[3]) == 2:
        try:
            trace_id, flags = int(parts[1], 16), int(parts[3], 16)
        except ValueError:
            return None  # not one: the SDK's propagator ignores it, and the ratio decides
        if trace_id and not flags & 1:
            return _Unrecorded(trace_id, _random.getrandbits(64) or 1, flags)
    return None


def request_span(flow: str, headers: dict[str, str], rid: str = ""):
    """The gateway's span of a request to ``flow`` (request id ``rid``), continuing the
    ``traceparent`` (and ``tracestate``) in its headers (lower-case names) if valid."""
    unsampled = _unsampled(headers)
    if unsampled is not None:
        return unsampled
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(headers) if HEADER in headers else None
    return tracer.start_span(
        f"POST /flows/{flow}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "url.path": f"/flows/{flow}",
            "flowserve.flow": flow,
            "flowserve.request.id": rid,
        },
    )


def traceparent(span) -> str:
    """The traceparent of ``span``: what the run messages carry for executors to continue."""
    return _traceparent(span.get_span_context())


def end_request(span, status: int) -> list[tuple[bytes, bytes]]:
    """End the request's span with the answer's HTTP status; the answer's headers that
    name its trace (``traceparent``, ``X-Trace-Id``)."""
    if span.is_recording():
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
    ctx = span.get_span_context()
    return [(HEADER.encode(), _traceparent(ctx).encode()), (TRACE_ID_HEADER.encode(), f"{ctx.trace_id:032x}".encode())]


# -- the executors ------------------------------------------------------------------------------


class Run:
    """A span while it is the thread's current one (nested spans are its children); ended
    when the ``with`` block ends. An error escaping the block is recorded on it."""

    __slots__ = ("span", "_token")

    def __init__(self, span):
        self.span = span
        self._token = None

    def __enter__(self) -> Run:
        from opentelemetry import context, trace

        self._token = context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind, value, _tb) -> None:
        from opentelemetry import context

        if value is not None:
            fail(value)
        context.detach(self._token)
        if self.span.is_recording():  # not ended early (end_current)
            self.span.end()


def start_run(name: str, tps: list[str], attributes: dict, link_attributes: list[dict] | None = None) -> Run:
    """A run's span: the child of the first traceparent's span; a run serving several
    requests (a batch) links each of them (with ``link_attributes``, one dict per request)."""
    from opentelemetry.trace import Link

    links = None
    if len(tps) > 1:
        extra = link_attributes or [{}] * len(tps)
        links = [Link(_span_context(tp), attrs) for tp, attrs in zip(tps, extra)]
    return Run(tracer.start_span(name, context=_context(tps[0]), attributes=attributes, links=links))


def event(name: str, tp: str, attributes: dict) -> None:
    """A span of no duration under traceparent ``tp``: something that happened to the
    request at once (a hedge's backup sent, a race copy dropped before it ran)."""
    tracer.start_span(name, context=_context(tp), attributes=attributes).end()


def child(name: str):
    """A span under the thread's current one, if that one is recorded (a traced run);
    else None. Used as ``with span:``, which ends it."""
    from opentelemetry import trace

    parent = trace.get_current_span()
    if not parent.is_recording():
        return None
    return tracer.start_span(name)


def end_current() -> None:
    """End the thread's current span now, if one is recorded: what the thread does next
    (a consumer's run, which has a span of its own) is no part of it."""
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.end()


def current_span_id() -> str:
    """The thread's current span's id (16 hex digits), "" outside a traced run."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.span_id:016x}" if ctx.is_valid else ""


def note(key: str, value) -> None:
    """Set an attribute on the thread's current span (a no-op outside a traced run)."""
    from opentelemetry import trace

    trace.get_current_span().set_attribute(key, value)


def fail(error: BaseException) -> None:
    """Mark the thread's current span failed with ``error`` (a no-op outside a traced run)."""
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
