"""OpenTelemetry trace context for jobs (docs/tracing.md).

Only when ``opentelemetry-api`` is importable (the ``otel`` extra); without it
every helper here is a no-op that allocates nothing, and the client imports
nothing of OpenTelemetry.

- Producer: ``send_span(queue, n)`` is a PRODUCER span ``send <queue>``
  around an enqueue; it yields the W3C ``traceparent`` / ``tracestate`` of
  that span as the job's headers (None when there is no valid context, e.g.
  the API without an SDK).
- Worker: ``process_span(job)`` is a CONSUMER span ``process <queue>`` around
  a handler. It always links to the producer's context; on the first
  attempt it is also its child (one connected trace from producer to
  handler), a retry (attempt > 1) starts a new trace linked to it.
Attributes follow the OpenTelemetry messaging conventions:
``messaging.system`` = ``pgque``, ``messaging.destination.name``,
``messaging.message.id``, ``messaging.operation.type`` /
``messaging.operation.name``, ``messaging.batch.message_count`` and
``pgque.job.kind`` / ``pgque.job.attempt``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROP: Any = TraceContextTextMapPropagator()
except ImportError:  # the otel extra is not installed
    _trace = None  # type: ignore[assignment]
    _PROP = None

ENABLED = _trace is not None
SYSTEM = "pgque"


def _tracer() -> Any:
    # Looked up per span, so a TracerProvider installed after import is used.
    return _trace.get_tracer("pgque_client")


@contextmanager
def send_span(queue: str, n: int = 1) -> Iterator[dict[str, str] | None]:
    """A PRODUCER span around an enqueue of ``n`` jobs into ``queue``; yields
    the headers to store with them (None: no trace context to carry)."""
    if not ENABLED:
        yield None
        return
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if n != 1:
        attrs["messaging.batch.message_count"] = n
    with _tracer().start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attrs) as span:
        if not span.get_span_context().is_valid:
            yield None
            return
        carrier: dict[str, str] = {}
        _PROP.inject(carrier)
        yield carrier or None


@contextmanager
def process_span(queue: str, job_id: int, kind: str, attempt: int, headers: Mapping[str, Any] | None) -> Iterator[Any]:
    """A CONSUMER span around one job's handler (see the module doc)."""
    if not ENABLED:
        yield None
        return
    parent = None
    links = []
    if headers and isinstance(headers.get("traceparent"), str):
        ctx = _PROP.extract(dict(headers))
        sc = _trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            links.append(Link(sc))
            if attempt <= 1:
                parent = ctx
    attrs = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": str(job_id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "pgque.job.kind": kind,
        "pgque.job.attempt": attempt,
    }
    span = _tracer().start_span(
        f"process {queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links
    )
    with _trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield span
        except BaseException as e:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
            raise


def with_headers(params: Mapping[str, str], options: dict[str, Any], headers: dict[str, str] | None) -> None:
    """Adds ``headers`` to an enqueue call's ``options`` when the server's
    function takes them and the caller gave none."""
    if headers is not None and "headers" in params and "headers" not in options:
        options["headers"] = headers
