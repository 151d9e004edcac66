"""A worker process, assembled: the store and bus of the settings, a :class:`Worker`,
the signals that drain it, and whatever serves beside it (``corral worker``).

What serves beside the worker (its metrics endpoint) comes from the front door
as a :data:`Sidecar`, so this module needs no HTTP server.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from corral.bus import open_settings_bus
from corral.core.settings import Settings
from corral.resources.secrets import SecretCipher
from corral.runtime.health import Operation
from corral.runtime.heap import freeze_startup_heap
from corral.runtime.journal import Observer
from corral.runtime.worker import Worker, default_owner
from corral.store import Store, open_store

log = logging.getLogger("corral")

#: Serves beside the worker (the store, the worker) until the event is set: the worker
#: has drained, so what it served (metrics, health) stays up while runs finish.
Sidecar = Callable[[Store, Worker, anyio.Event], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker process claims and executes runs (``corral worker``'s options)."""

    concurrency: int = 8
    lease_seconds: float = 30.0
    grace_seconds: float = 30.0
    #: how often the store is swept for runs; by default 5 s with a dispatching bus
    #: (NATS hands out runs as they are announced), else 0.5 s
    poll_seconds: float | None = None


async def run_worker(
    settings: Settings,
    options: WorkerOptions,
    *,
    observer: Observer | None = None,
    on_error: Callable[[Operation], None] | None = None,
    sidecar: Sidecar | None = None,
) -> None:
    """Claim and execute runs until SIGTERM or SIGINT, then drain (grace period, then release).

    ``observer`` sees every event the worker's runs emit, ``on_error`` each failed store or
    bus operation (both: the metrics); ``sidecar`` serves beside the worker until it drained.
    """
    owner = default_owner()
    stop, drained = anyio.Event(), anyio.Event()
    store = await open_store(
        settings.db_url, settings=settings, cipher=SecretCipher.from_settings(settings)
    )
    try:
        async with await open_settings_bus(settings, name=f"corral worker {owner}") as bus:
            default_poll = 5.0 if bus.dispatches else 0.5
            worker = Worker(
                store,
                settings,
                concurrency=options.concurrency,
                lease_seconds=options.lease_seconds,
                grace_seconds=options.grace_seconds,
                poll_seconds=default_poll if options.poll_seconds is None else options.poll_seconds,
                owner=owner,
                bus=bus,
                observer=observer,
                on_error=on_error,
            )
            via = "NATS" if bus.dispatches else "the store"
            log.info("worker %s started (runs from %s)", worker.owner, via)
            freeze_startup_heap()
            async with anyio.create_task_group() as group:
                if sidecar is not None:
                    group.start_soon(sidecar, store, worker, drained)
                group.start_soon(_stop_on_signal, stop)
                await worker.serve(stop)
                drained.set()
                group.cancel_scope.cancel()
    finally:
        await store.close()


async def _stop_on_signal(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for signum in received:
            log.info("%s received: no new runs; stopping", signal.Signals(signum).name)
            stop.set()
            return


def exit_past_leftover_threads(warning: str | None = None, *, code: int = 0) -> None:
    """Exit with ``code`` now, without joining threads left behind (logging ``warning`` if
    any are); without such threads, return (the caller exits as usual).

    After a drain every run is finished or released, but threads may remain: the
    idle threads of the worker pool, or a cancelled synchronous tool whose function
    cannot be interrupted (its run was released and is journaled). Interpreter exit
    would wait for them.
    """
    import os
    import sys
    import threading

    if threading.active_count() > 1:
        if warning is not None:
            log.warning(warning)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
