"""A small OTLP/HTTP trace receiver for tests: what a real collector is to the cluster.

The gateway and the executors are processes of their own, so their spans cannot reach the
test through an exporter in its process: each exports over OTLP/HTTP (the exporter users
run, configured the way users configure it), and this server, in the test's process, takes
the protobuf requests (``ExportTraceServiceRequest``, from opentelemetry-proto), turns each
span back into the SDK's ``ReadableSpan`` and hands it to the SDK's ``InMemorySpanExporter``,
which the test reads. Why not a file exporter: the runtime would need a second exporter
path that only tests take; this way what is tested is what is shipped.

    with OTLPCollector() as collector:          # collector.endpoint: .../v1/traces
        ...                                     # a cluster with TracingConfig(endpoint=collector.endpoint)
        spans = collector.trace(trace_id, until=lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind is not None else None


def _attributes(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


def _context(trace_id: bytes, span_id: bytes, flags: int = 1) -> SpanContext:
    return SpanContext(
        int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), is_remote=True, trace_flags=TraceFlags(flags)
    )


_KINDS = {1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT, 4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}


def spans_of(request: ExportTraceServiceRequest) -> list[ReadableSpan]:
    """The SDK's spans of one OTLP export request."""
    out = []
    for rs in request.resource_spans:
        resource = Resource(_attributes(rs.resource.attributes))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReadableSpan(
                        name=s.name,
                        context=_context(s.trace_id, s.span_id, s.flags & 0xFF or 1),
                        parent=_context(s.trace_id, s.parent_span_id) if s.parent_span_id else None,
                        resource=resource,
                        attributes=_attributes(s.attributes),
                        links=[
                            Link(_context(link.trace_id, link.span_id), _attributes(link.attributes))
                            for link in s.links
                        ],
                        events=[Event(e.name, _attributes(e.attributes), e.time_unix_nano) for e in s.events],
                        kind=_KINDS.get(s.kind, SpanKind.INTERNAL),
                        status=Status(StatusCode.ERROR) if s.status.code == 2 else Status(StatusCode.UNSET),
                        start_time=s.start_time_unix_nano,
                        end_time=s.end_time_unix_nano,
                    )
                )
    return out


class OTLPCollector:
    """An OTLP/HTTP receiver on 127.0.0.1 (a free port) feeding an InMemorySpanExporter."""

    def __init__(self):
        self.exporter = InMemorySpanExporter()
        self.requests = 0
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server API)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.exporter.export(spans_of(request))
                collector.requests += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet: the test's output is for the test
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-collector", daemon=True)

    def __enter__(self) -> OTLPCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def trace(self, trace_id: int | str, until=lambda spans: bool(spans), timeout: float = 20.0) -> list[ReadableSpan]:
        """The spans of one trace received so far, once ``until(spans)`` holds (the
        processes export in batches, in the background); AssertionError after ``timeout``."""
        if isinstance(trace_id, str):
            trace_id = int(trace_id, 16)
        deadline = time.monotonic() + timeout
        while True:
            spans = [s for s in self.spans() if s.context.trace_id == trace_id]
            if until(spans):
                return spans
            if time.monotonic() > deadline:
                shown = "\n".join(f"  {s.name} {dict(s.attributes)}" for s in spans)
                raise AssertionError(f"trace {trace_id:032x}: {len(spans)} spans after {timeout:g} s:\n{shown}")
            time.sleep(0.05)
