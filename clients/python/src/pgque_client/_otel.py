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
- Events (docs/tracing.md, "Events"): the producers use ``send_span`` as
  well; ``event_span(queue, consumer, message)`` is a CONSUMER span
  ``process <queue>`` around one event's handler call, with the same rules
  (linked to the producer, its child on the first delivery, a new trace on a
  redelivery: ``retry_count`` > 0). ``active()`` tells a consumer whether to
  read the events' headers at all (an SDK's tracer provider is installed).
Attributes follow the OpenTelemetry messaging conventions:
``messaging.system`` = ``pgque``, ``messaging.destination.name``,
``messaging.message.id``, ``messaging.operation.type`` /
``messaging.operation.name``, ``messaging.batch.message_count`` and
``pgque.job.kind`` / ``pgque.job.attempt``; on event spans
``messaging.consumer.group.name`` (the consumer), ``pgque.event.type`` and
``pgque.event.retry_count``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
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


def active() -> bool:
    """Whether spans are recorded: the API is installed and a tracer provider
    other than the API's default (no-op, or the proxy that stands in until
    one is set) is installed. Consumers read event headers only then."""
    if not ENABLED:
        return False
    return not isinstance(_trace.get_tracer_provider(), (NoOpTracerProvider, ProxyTracerProvider))


def _producer(headers: Mapping[str, Any] | None, first: bool) -> tuple[Any, list[Any]]:
    """The parent context (the producer's on a first delivery, else None:
    a new trace) and the links (to the producer) of a process span."""
    if headers and isinstance(headers.get("traceparent"), str):
        ctx = _PROP.extract(dict(headers))
        sc = _trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            return (ctx if first else None), [Link(sc)]
    return None, []


@contextmanager
def process_span(queue: str, job_id: int, kind: str, attempt: int, headers: Mapping[str, Any] | None) -> Iterator[Any]:
    """A CONSUMER span around one job's handler (see the module doc)."""
    if not ENABLED:
        yield None
        return
    parent, links = _producer(headers, attempt <= 1)
    attrs = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": str(job_id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "pgque.job.kind": kind,
        "pgque.job.attempt": attempt,
    }
    with _consumer_span(f"process {queue}", parent, attrs, links) as span:
        yield span


@contextmanager
def event_span(queue: str, consumer: str, msg_id: int, type_name: str, retry_count: int | None,
               headers: Mapping[str, Any] | None) -> Iterator[Any]:  # fmt: skip
    """A CONSUMER span around one event's handler call (see the module doc);
    ``retry_count`` None or 0 is the first delivery."""
    if not ENABLED:
        yield None
        return
    retries = retry_count or 0
    parent, links = _producer(headers, retries == 0)
    attrs = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.consumer.group.name": consumer,
        "messaging.message.id": str(msg_id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "pgque.event.type": type_name,
        "pgque.event.retry_count": retries,
    }
    with _consumer_span(f"process {queue}", parent, attrs, links) as span:
        yield span


@contextmanager
def _consumer_span(name: str, parent: Any, attrs: dict[str, Any], links: list[Any]) -> Iterator[Any]:
    """A CONSUMER span made current around the block; an exception from the
    block is recorded on it and marks it as an error."""
    span = _tracer().start_span(name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links)
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
