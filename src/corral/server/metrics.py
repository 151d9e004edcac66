"""Prometheus metrics of one ``corral serve`` process, on its own registry.

Two sources:

- *The store, at scrape time*: runs by state and the queue depth (queued runs
  already due) - the whole deployment's, whoever executes the runs.
- *The events of the runs this process executes* (its embedded workers): model
  latency, tokens, cost, tool calls and tool errors by code, finished runs by
  state; and the workers' store and bus errors by operation (claim, sweep,
  renew, approvals, retention: a fixed set). A standalone ``corral worker`` counts its own runs the same way and
  serves them with ``--metrics-port`` (:mod:`corral.server.worker_metrics`).

Plus the HTTP layer: requests by method, route template and status, their
duration, and the open event streams. ``/metrics`` needs no token, so no label
carries a name (namespace, agent, tool, endpoint) and every label value comes
from a fixed set, whatever a client sends: the method is one of HTTP's own or
``other``, the route is a template of the app's or ``unmatched``, the status is
a registered HTTP status or ``other``.
"""

from __future__ import annotations

import time
from http import HTTPMethod, HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.core.events import (
    Event,
    MessageCreateData,
    RunFinishData,
    StepStartData,
    ToolResultData,
)
from corral.core.runs import RunState
from corral.runtime.health import OPERATIONS, Operation
from corral.store.base import Store, StoreError

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_METHODS = frozenset(HTTPMethod)
_STATUSES = frozenset(HTTPStatus)


class Metrics:
    """The metrics of one server process; :meth:`observe` is the embedded workers' observer."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs = Gauge("corral_runs", "Runs in the store, by state.", ["state"], registry=r)
        self.queue_depth = Gauge(
            "corral_queue_depth", "Queued runs that are due (claimable now).", registry=r
        )
        self.store_up = Gauge(
            "corral_store_up",
            "1 if the store answered this scrape's counts (0: corral_runs and "
            "corral_queue_depth are the last figures read).",
            registry=r,
        )
        self.model_latency = Histogram(
            "corral_model_latency_seconds",
            "Time of one model turn (request to complete response), embedded workers.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "corral_model_tokens",
            "Model tokens used by runs of the embedded workers.",
            ["direction"],
            registry=r,
        )
        self.cost = Counter(
            "corral_model_cost_usd", "Model cost (USD) of runs of the embedded workers.", registry=r
        )
        self.tool_calls = Counter(
            "corral_tool_calls",
            "Tool calls that reported back, by outcome (ok or error).",
            ["outcome"],
            registry=r,
        )
        self.tool_errors = Counter(
            "corral_tool_errors", "Failed tool calls by error code.", ["code"], registry=r
        )
        self.runs_finished = Counter(
            "corral_runs_finished",
            "Runs the embedded workers finished, by final state.",
            ["state"],
            registry=r,
        )
        self.http_requests = Counter(
            "corral_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "corral_http_request_duration_seconds",
            "Time to the start of the response, by method and route template.",
            ["method", "route"],
            registry=r,
        )
        self.event_streams = Gauge("corral_event_streams", "Open SSE event streams.", registry=r)
        self.worker_errors = Counter(
            "corral_worker_errors",
            "Store and bus errors of the workers' recurring operations (each retried).",
            ["operation"],
            registry=r,
        )
        for operation in OPERATIONS:  # every series exists from the start, at 0
            self.worker_errors.labels(operation)
        self._step_started: dict[str, float] = {}

    async def observe(self, event: Event) -> None:
        """Count what one event of a run executed in this process says."""
        match event.data:
            case StepStartData():
                self._step_started[event.run_id] = event.ts
            case MessageCreateData(endpoint=str(), usage=usage, cost_usd=cost):
                started = self._step_started.pop(event.run_id, None)
                if started is not None:
                    self.model_latency.observe(max(0.0, event.ts - started))
                usage = usage or {}
                self.tokens.labels("input").inc(_number(usage.get("input_tokens")))
                self.tokens.labels("output").inc(_number(usage.get("output_tokens")))
                self.cost.inc(_number(cost))
            case ToolResultData(error=error):
                if error is not None:
                    self.tool_calls.labels("error").inc()
                    self.tool_errors.labels(str(error.get("code", "unknown"))).inc()
                else:
                    self.tool_calls.labels("ok").inc()
            case RunFinishData(state=state):
                self._step_started.pop(event.run_id, None)
                self.runs_finished.labels(state).inc()
            case _:
                pass  # (the other events count toward no metric)

    def count_worker_error(self, operation: Operation) -> None:
        """One failure of a worker's ``operation`` (the worker's ``on_error``)."""
        self.worker_errors.labels(operation).inc()

    async def render(self, store: Store) -> bytes:
        """The exposition text, with the store's figures read now.

        A store that does not answer fails no scrape (the worker's error counters matter
        most then): its gauges keep their last figures and ``corral_store_up`` is 0."""
        try:
            counts = await store.count_runs(now=time.time())
        except StoreError:
            self.store_up.set(0)
            return generate_latest(self.registry)
        self.store_up.set(1)
        totals = dict.fromkeys(RunState, 0)
        for (_, state), count in counts.by_state.items():
            totals[state] += count
        for state, count in totals.items():
            self.runs.labels(state.value).set(count)
        self.queue_depth.set(counts.due)
        return generate_latest(self.registry)


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


class HttpMetricsMiddleware:
    """Counts requests by route template (``/v1/tasks/{task_id}``), never by raw path."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def timed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                self.metrics.http_duration.labels(_method_of(scope), _route_of(scope)).observe(
                    time.perf_counter() - started
                )
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            self.metrics.http_requests.labels(
                _method_of(scope), _route_of(scope), _status_label(status)
            ).inc()


def _method_of(scope: Scope) -> str:
    # Any token is a valid method on the wire (`QQQQ...`): each would be a new series.
    method = scope["method"]
    return method if method in _METHODS else "other"


def _route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


def _status_label(status: int) -> str:
    return str(status) if status in _STATUSES else "other"
