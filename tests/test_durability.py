"""Durable runs survive real worker deaths: ``corral worker`` processes killed for real.

Each test starts ``python -m corral worker`` subprocesses on one ``CORRAL_HOME``
(SQLite store), drives the model with the fake OpenAI server of this process
and the tools of :mod:`durable_tools`, then kills (SIGKILL), freezes
(SIGSTOP) or stops (SIGTERM) a worker at a chosen point of the run and lets
another worker finish it. What must hold: nothing journaled is done again
(no model call re-asked, no side effect repeated), a non-idempotent call cut
off is re-run only with a human's approval, a stalled worker cannot commit
after losing its lease, and the journal stays gap-free.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from corral.bus.base import Bus
from corral.core.events import Event, EventType, parse_event_data
from corral.core.messages import Message, dump
from corral.core.runs import Lease, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.resources.secrets import SecretCipher
from corral.runtime.executor import RunExecutor
from corral.runtime.operations import submit as submit_run
from corral.store import Store, open_store
from corral.store.base import StoreError
from corral.store.sqlite import SqliteStore
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall, RecordedRequest
from durable_tools import ENV_DIR, GATES, Gate
from fake_clock import FakeClock
from fixtures_models import fake_openai_fixture, openai_server_fixture

__all__ = ["fake_openai_fixture", "openai_server_fixture"]

T = TypeVar("T")
TESTS = Path(__file__).parent
#: how long any awaited condition may take before the test fails (never a fixed sleep)
TIMEOUT = 20.0
#: how long the slow tool call takes the first time: long enough to be caught in it
SLOW = 4.0


def resources(base_url: str, durable_dir: Path) -> str:
    """The fake model, the python tool as idempotent (``perform``) and not
    (``perform_unsafe``), the same tool as an idempotent program (``perform_exec``)."""
    python_tools = "\n---\n".join(
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: {name}}}
spec:
  type: python
  python: {{function: "durable_tools:perform_once", path: "{TESTS}"}}
  idempotent: {idempotent}
  timeout_seconds: 60
"""
        for name, idempotent in (("perform", "true"), ("perform_unsafe", "false"))
    )
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec:
  provider: openai
  model: test-model
  base_url: {base_url}
  timeout_seconds: 60
  retry: {{max_attempts: 1}}
---
{python_tools}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: perform_exec}}
spec:
  type: exec
  exec:
    command: ["{sys.executable}", "{TESTS / "durable_tools.py"}"]
    env: {{{ENV_DIR}: "{durable_dir}"}}
    # its side effects land in the test's directory on the host, outside any sandbox
    isolation: {{mode: none}}
  parameters:
    type: object
    properties: {{label: {{type: string}}, seconds: {{type: number}}}}
    required: [label]
  idempotent: true
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: clerk}}
spec:
  model: fake
  tools: [perform, perform_unsafe, perform_exec]
"""


def call(tool: str, label: str, seconds: float = 0.0) -> FakeReply:
    """A model turn calling ``tool`` once."""
    return FakeReply(tool_calls=[FakeToolCall(tool, {"label": label, "seconds": seconds})])


# --------------------------------------------------------------------------- processes


@dataclass
class WorkerProcess:
    """One ``corral worker`` subprocess; its stdout and stderr go to ``log``."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def exited(self, timeout: float = TIMEOUT) -> int:
        """Wait for the process to exit; its exit code.

        On timeout the process is sent SIGABRT, so its log ends with the stack of
        every thread (``PYTHONFAULTHANDLER``): where it hung.
        """
        try:
            with anyio.fail_after(timeout):
                while (code := self.process.poll()) is None:
                    await anyio.sleep(0.05)
        except TimeoutError:
            self.signal(signal.SIGABRT)
            raise
        return code


@dataclass
class Cluster:
    """A ``CORRAL_HOME`` with its store, the fake model, and the workers started on it."""

    home: Path
    store: Store
    model: FakeOpenAIServer
    workers: list[WorkerProcess] = field(default_factory=list[WorkerProcess])
    #: where submits are announced (the scale-out variant's NATS; none on SQLite)
    bus: Bus | None = None

    @property
    def durable_dir(self) -> Path:
        return self.home / "durable"

    @property
    def db_path(self) -> Path:
        return self.home / "corral.db"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(CORRAL_HOME=str(self.home), PYTHONFAULTHANDLER="1")
        env[ENV_DIR] = str(self.durable_dir)
        return env

    def start_worker(
        self, name: str, *, lease: float = 2.0, grace: float = 30.0, poll: float = 0.1
    ) -> WorkerProcess:
        """Start ``corral worker`` with these settings."""
        log = self.home / f"worker-{name}.log"
        argv = [sys.executable, "-m", "corral", "worker", "--concurrency", "1"]
        argv += ["--lease-seconds", str(lease), "--grace-seconds", str(grace)]
        argv += ["--poll-seconds", str(poll)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, env=self.environment(), cwd=self.home, stdout=out, stderr=subprocess.STDOUT
            )
        worker = WorkerProcess(name, process, log)
        self.workers.append(worker)
        return worker

    async def corral(self, *args: str) -> str:
        """Run one ``corral`` command to completion; its stdout (it must succeed)."""
        done = await anyio.run_process(
            [sys.executable, "-m", "corral", *args],
            env=self.environment(),
            cwd=self.home,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout.decode()

    def kill_all(self) -> None:
        """Leave no worker behind, stopped ones included."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGKILL)
            worker.process.wait(timeout=10)

    # -- observations

    async def run(self, run_id: str) -> RunRecord:
        record = await self.store.get_run(run_id)
        assert record is not None
        return record

    async def events(self, run_id: str) -> list[Event]:
        return await self.store.list_events(run_id)

    def invocations(self) -> list[str]:
        """The labels of every tool invocation, in order."""
        path = self.durable_dir / "invocations.log"
        return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []

    def invocation_keys(self) -> Counter[str]:
        """How many times the tool was invoked per idempotency key."""
        path = self.durable_dir / "invocations.log"
        return Counter(line.split()[0] for line in path.read_text().splitlines())

    def effects(self) -> dict[str, str]:
        """The side effects performed: idempotency key (as a file name) -> label."""
        directory = self.durable_dir / "effects"
        return {p.name: p.read_text() for p in sorted(directory.iterdir())}

    async def wait_for_event(self, run_id: str, type: EventType) -> Event:
        async def found() -> Event | None:
            return next((e for e in await self.events(run_id) if e.type is type), None)

        return await eventually(found, f"a {type} event of run {run_id}")

    async def wait_for_effect(self, label: str) -> None:
        """Wait until a tool call performed the effect ``label`` (and is now in its slow part)."""

        async def performed() -> bool | None:
            return label in self.effects().values() or None

        await eventually(performed, f"the effect {label!r}")

    async def wait_for_state(self, run_id: str, state: RunState) -> RunRecord:
        async def reached() -> RunRecord | None:
            record = await self.run(run_id)
            if record.state.finished and record.state is not state:
                raise AssertionError(f"run {run_id} ended {record.state}: {record.error}")
            return record if record.state is state else None

        return await eventually(reached, f"run {run_id} {state}")

    async def freeze(self, worker: WorkerProcess) -> None:
        """SIGSTOP ``worker``, but never while it holds SQLite's write lock.

        A process frozen inside a write transaction would block every other
        writer for the busy timeout: a hazard of SQLite, not what is tested.
        """
        for _ in range(50):
            worker.signal(signal.SIGSTOP)
            if not _write_locked(self.db_path):
                return
            worker.signal(signal.SIGCONT)
            await anyio.sleep(0.02)
        raise AssertionError("the worker kept holding the database write lock")


def _write_locked(db_path: Path) -> bool:
    connection = sqlite3.connect(db_path, timeout=0.2, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        connection.close()


async def eventually(check: Callable[[], Awaitable[T | None]], what: str) -> T:
    """Poll ``check`` until it returns something; fail after ``TIMEOUT`` seconds."""
    deadline = time.monotonic() + TIMEOUT
    while (result := await check()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.05)
    return result


@pytest.fixture
async def cluster(tmp_path: Path, fake_openai: FakeOpenAIServer) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    (home / "durable" / "effects").mkdir(parents=True)
    store = await open_store(f"sqlite:///{home / 'corral.db'}")
    await store.apply(load_text(resources(fake_openai.base_url, home / "durable"), "durable.yaml"))
    created = Cluster(home, store, fake_openai)
    try:
        yield created
    finally:
        created.kill_all()
        await store.close()


async def submit(cluster: Cluster, prompt: str) -> str:
    record, _ = await submit_run(cluster.store, "clerk", prompt, bus=cluster.bus)
    return record.id


# --------------------------------------------------------------------------- journal checks


def check_journal(events: list[Event]) -> None:
    """Gap-free, one run.start and one run.finish at the ends, one model answer per step."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [e.type for e in events]
    assert kinds[0] is EventType.RUN_START and kinds[-1] is EventType.RUN_FINISH
    assert kinds.count(EventType.RUN_START) == kinds.count(EventType.RUN_FINISH) == 1
    steps = [e.data.step for e in events if e.type is EventType.MESSAGE_CREATE]
    assert steps == list(range(1, len(steps) + 1)), steps
    results = Counter(e.data.call_id for e in events if e.type is EventType.TOOL_RESULT)
    assert all(n == 1 for n in results.values()), results


def tool_results_in(request: RecordedRequest) -> int:
    return sum(1 for m in request.json["messages"] if m["role"] == "tool")


# --------------------------------------------------------------------------- tests


async def test_sigkill_during_an_idempotent_tool_call_reruns_it_without_a_second_effect(
    cluster: Cluster,
) -> None:
    cluster.model.add_reply(
        call("perform", "first", SLOW), call("perform", "second"), FakeReply(text="all done")
    )
    run_id = await submit(cluster, "do both")
    a = cluster.start_worker("a", lease=2.0)
    await cluster.wait_for_effect("first")  # the call is in its slow part
    await cluster.wait_for_event(run_id, EventType.TOOL_CALL)  # journaled before
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL
    assert cluster.invocations() == ["first"]  # killed in the call, after its effect

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)

    assert record.output == "all done" and record.attempts == 2
    # each model call answered once: the journaled first step was not asked again
    assert [tool_results_in(r) for r in cluster.model.requests] == [0, 1, 2]
    # the interrupted call ran again under the same key, and its effect happened once
    assert cluster.invocations() == ["first", "first", "second"]
    assert sorted(cluster.invocation_keys().values()) == [1, 2]
    assert sorted(cluster.effects().values()) == ["first", "second"]
    events = await cluster.events(run_id)
    check_journal(events)
    assert [e.data.step for e in events if e.type is EventType.MESSAGE_CREATE] == [1, 2, 3]
    assert sum(e.type is EventType.TOOL_CALL for e in events) == 3  # 2 calls, 1 re-run
    shown = json.loads(await cluster.corral("tasks", "get", run_id, "-o", "json"))
    assert (shown["state"], shown["output"], shown["attempts"]) == ("succeeded", "all done", 2)


async def test_sigkill_during_a_model_call_does_not_repeat_the_journaled_one(
    cluster: Cluster,
) -> None:
    # the first request is answered at once, the second hangs until the worker is dead
    cluster.model.delay(0).delay(15)
    cluster.model.add_reply(
        call("perform", "only"),
        FakeReply(text="never delivered"),  # taken by the request that hangs
        FakeReply(text="finished"),
    )
    run_id = await submit(cluster, "do it")
    a = cluster.start_worker("a", lease=2.0)

    async def second_request() -> bool | None:
        return cluster.model.calls >= 2 or None

    await eventually(second_request, "the second model request")
    # The idempotent call's result is committed "ahead": its commit (carrying the call and
    # the model's first answer) may still be in flight while the second request is out, and a
    # crash before it lands rightly asks again (README, "Journal and replay"). What is tested
    # here is a kill once it is durable.
    await cluster.wait_for_event(run_id, EventType.TOOL_RESULT)
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)

    assert record.output == "finished"
    requests = cluster.model.requests
    assert len(requests) == 3
    # the request holding only the prompt came once; the interrupted one was asked again
    assert [tool_results_in(r) for r in requests] == [0, 1, 1]
    assert requests[1].json["messages"] == requests[2].json["messages"]
    assert cluster.invocations() == ["only"]
    assert list(cluster.effects().values()) == ["only"]
    check_journal(await cluster.events(run_id))


async def test_interrupted_non_idempotent_call_waits_for_a_human_before_running_again(
    cluster: Cluster,
) -> None:
    cluster.model.add_reply(call("perform_unsafe", "pay", SLOW), FakeReply(text="paid"))
    run_id = await submit(cluster, "pay the bill")
    a = cluster.start_worker("a", lease=2.0)
    await cluster.wait_for_effect("pay")  # the call is in its slow part
    await cluster.wait_for_event(run_id, EventType.TOOL_CALL)  # journaled before
    a.signal(signal.SIGKILL)
    assert await a.exited() == -signal.SIGKILL

    cluster.start_worker("b")
    await cluster.wait_for_state(run_id, RunState.WAITING_APPROVAL)
    [approval] = await cluster.store.list_approvals(run_id=run_id, states=["pending"])
    assert approval.tool == "perform_unsafe" and "interrupted" in approval.reason
    assert cluster.invocations() == ["pay"]  # not run again on its own

    out = await cluster.corral("approvals", "approve", approval.id)
    assert f"{approval.id} approved" in out
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)

    assert record.output == "paid"
    assert cluster.invocations() == ["pay", "pay"]  # the crashed one, the approved one
    assert list(cluster.effects().values()) == ["pay"]
    assert cluster.model.calls == 2
    events = await cluster.events(run_id)
    check_journal(events)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.APPROVAL_REQUESTED) == kinds.count(EventType.APPROVAL_RESOLVED)
    assert kinds.count(EventType.APPROVAL_RESOLVED) == 1
    assert kinds.count(EventType.TOOL_CALL) == 2
    # the re-run began only after the human's decision
    resolved = kinds.index(EventType.APPROVAL_RESOLVED)
    assert kinds.index(EventType.TOOL_CALL, resolved) > resolved


async def test_stalled_worker_past_its_lease_cannot_commit_after_another_finished(
    cluster: Cluster,
) -> None:
    cluster.model.add_reply(call("perform", "slow", SLOW), FakeReply(text="finished by b"))
    run_id = await submit(cluster, "take your time")
    a = cluster.start_worker("a", lease=1.5)
    await cluster.wait_for_effect("slow")  # the call is in its slow part
    await cluster.wait_for_event(run_id, EventType.TOOL_CALL)  # journaled before
    await cluster.freeze(a)
    frozen = await cluster.run(run_id)

    # (b's lease is long: under a loaded machine a late renewal of a short one lets b's
    # own sweep claim the run again, which is safe but would muddle the count below)
    cluster.start_worker("b", lease=10.0)
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)
    assert record.fencing_token > frozen.fencing_token  # b's claim fenced a off
    assert record.lease_owner is None
    before = await cluster.events(run_id)
    check_journal(before)
    model_calls = cluster.model.calls

    a.signal(signal.SIGCONT)

    async def lease_lost() -> bool | None:
        return f"run {run_id} (agent clerk): lease lost" in a.output() or None

    await eventually(lease_lost, "worker a to notice it lost the lease")
    after = await cluster.run(run_id)
    assert (after.state, after.output, after.fencing_token) == (
        RunState.SUCCEEDED,
        "finished by b",
        record.fencing_token,
    )
    assert await cluster.events(run_id) == before
    assert cluster.model.calls == model_calls
    assert list(cluster.effects().values()) == ["slow"]
    # a is alive and well: it handled the lost lease and stops cleanly when asked
    assert a.process.poll() is None
    a.signal(signal.SIGTERM)
    assert await a.exited() == 0
    assert "Traceback" not in a.output()


async def test_a_write_refused_inside_parallel_tool_calls_counts_as_a_lost_lease(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process, to order it: the tool result is written after another claim and before
    # the heartbeat notices (the race a resumed SIGSTOPped worker runs). The refusal is
    # raised inside the loop's task group of parallel calls, so it arrives grouped.
    monkeypatch.setenv(ENV_DIR, str(cluster.durable_dir))
    cluster.model.add_reply(call("perform", "late", 0.5))
    run_id = await submit(cluster, "go")
    [(record, lease)] = await cluster.store.claim_runs("stalled", 60)
    settings = Settings(home=cluster.home, db_url=f"sqlite:///{cluster.db_path}", secret_key=None)
    executor = RunExecutor(cluster.store, settings, lease_seconds=60)  # heartbeat in 20 s

    async def claim_meanwhile() -> None:
        await cluster.wait_for_effect("late")
        # the call is idempotent: journaled behind, up to 10 ms into it; a claim before
        # that write would refuse the call itself, not the result this test is about
        await cluster.wait_for_event(run_id, EventType.TOOL_CALL)
        [(_, taken)] = await cluster.store.claim_runs("other", 60, now=time.time() + 120)
        assert taken.token == lease.token + 1

    async with executor, anyio.create_task_group() as group:
        group.start_soon(claim_meanwhile)
        with anyio.fail_after(TIMEOUT):
            outcome = await executor.execute(record, lease)

    assert outcome == "lost"
    kinds = [e.type for e in await cluster.events(run_id)]
    assert EventType.TOOL_RESULT not in kinds and kinds[-1] is EventType.TOOL_CALL


#: an idempotent tool that waits for the test (in-process executors only), and its agent
GATED = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: wait_at_gate}}
spec:
  type: python
  python: {{function: "durable_tools:wait_at_gate", path: "{TESTS}"}}
  idempotent: true
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: gatekeeper}}
spec:
  model: fake
  tools: [wait_at_gate]
"""


class RenewalsStall(SqliteStore):
    """A real store whose lease renewals, while ``stalled``, hang (``hang``) or fail as a
    locked database's do."""

    stalled = True
    hang = True

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> tuple[Lease, bool]:
        if not self.stalled:
            return await super().renew_lease(lease, lease_seconds)
        if self.hang:
            await anyio.sleep_forever()
        raise StoreError("cannot renew the lease: the database stayed locked")


@pytest.mark.parametrize("renewals", ["hang", "fail"])
async def test_a_worker_whose_lease_ran_out_unrenewed_starts_no_model_call(
    cluster: Cluster, renewals: str
) -> None:
    # In-process, on a fake clock: worker a's renewals never succeed, its lease runs out
    # while its idempotent tool call is in flight, and b claims the run. The call's result
    # would be written ahead (refused only later, with the next model call on the wire):
    # a, its lease unrenewed for a lease's length, first has the store renew it, which is
    # refused (or fails, or hangs: no answer is no lease), asks the model nothing more and
    # stops as a lost lease.
    lease_seconds = 30.0
    await cluster.store.apply(load_text(GATED, "gated.yaml"))
    cluster.model.add_reply(
        FakeReply(tool_calls=[FakeToolCall("wait_at_gate", {"gate": "g"})]),
        FakeReply(text="finished by b"),
    )
    gate = GATES["g"] = Gate()
    record, _ = await submit_run(cluster.store, "gatekeeper", "go")
    settings = Settings(home=cluster.home, db_url=f"sqlite:///{cluster.db_path}", secret_key=None)
    stalled = await RenewalsStall.open(
        f"sqlite:///{cluster.db_path}", cipher=SecretCipher(key=SecretCipher.generate_key())
    )
    stalled.hang = renewals == "hang"
    clock = FakeClock()
    outcomes: list[str] = []
    try:
        [(claimed, lease)] = await stalled.claim_runs("a", lease_seconds)
        a = RunExecutor(stalled, settings, lease_seconds=lease_seconds, clock=clock)

        async def execute_a() -> None:
            outcomes.append(await a.execute(claimed, lease))

        async with a, anyio.create_task_group() as group:
            group.start_soon(execute_a)
            with anyio.fail_after(TIMEOUT):
                await gate.arrived.wait()
            assert cluster.model.calls == 1
            # a lease and a second pass with the call in flight; the renewals due meanwhile
            # hang (or fail): the keeper never hears the lease is gone
            clock.advance(lease_seconds + 1)
            # (the call went to disk behind it, 10 ms in, still within the lease)
            await cluster.wait_for_event(record.id, EventType.TOOL_CALL)
            [(taken, b_lease)] = await cluster.store.claim_runs(
                "b", 60, now=time.time() + lease_seconds + 1
            )
            assert b_lease.token == lease.token + 1
            gate.opened.set()  # a's call returns, into a lease a knows ran out
            if stalled.hang:  # a's renewal of its own (now) waits a third of a lease
                with anyio.fail_after(TIMEOUT):
                    await clock.sleeping()
                clock.advance(lease_seconds / 3)
        assert outcomes == ["lost"]
        assert cluster.model.calls == 1  # no model call after the lease ran out
        kinds = [e.type for e in await cluster.events(record.id)]
        assert EventType.TOOL_RESULT not in kinds and kinds[-1] is EventType.TOOL_CALL

        b = RunExecutor(cluster.store, settings, lease_seconds=60)
        async with b:
            with anyio.fail_after(TIMEOUT):
                assert await b.execute(taken, b_lease) == "done"
    finally:
        GATES.pop("g", None)
        await stalled.close()

    final = await cluster.run(record.id)
    assert (final.state, final.output, final.fencing_token) == (
        RunState.SUCCEEDED,
        "finished by b",
        b_lease.token,
    )
    assert cluster.model.calls == 2  # a's first, b's after re-running the idempotent call
    assert gate.calls == 2
    events = await cluster.events(record.id)
    check_journal(events)  # finished once
    assert [e.data.step for e in events if e.type is EventType.MESSAGE_CREATE] == [1, 2]


async def test_a_run_outlasting_its_lease_goes_on_while_its_renewals_succeed(
    cluster: Cluster,
) -> None:
    # The other side of the test above: each renewal that succeeds moves the lease's
    # deadline on, so a call in flight for three leases is no reason to stop.
    lease_seconds = 30.0
    await cluster.store.apply(load_text(GATED, "gated.yaml"))
    cluster.model.add_reply(
        FakeReply(tool_calls=[FakeToolCall("wait_at_gate", {"gate": "g"})]),
        FakeReply(text="finished by a"),
    )
    gate = GATES["g"] = Gate()
    record, _ = await submit_run(cluster.store, "gatekeeper", "go")
    settings = Settings(home=cluster.home, db_url=f"sqlite:///{cluster.db_path}", secret_key=None)
    clock = FakeClock()
    outcomes: list[str] = []
    try:
        [(claimed, lease)] = await cluster.store.claim_runs("a", lease_seconds)
        a = RunExecutor(cluster.store, settings, lease_seconds=lease_seconds, clock=clock)

        async def execute_a() -> None:
            outcomes.append(await a.execute(claimed, lease))

        async with a, anyio.create_task_group() as group:
            group.start_soon(execute_a)
            with anyio.fail_after(TIMEOUT):
                await gate.arrived.wait()
                for _ in range(9):  # a renewal round every third of the lease, each done
                    await clock.sleeping()  # before the next begins
                    clock.advance(lease_seconds / 3)
                await clock.sleeping()
            gate.opened.set()
    finally:
        GATES.pop("g", None)
    assert outcomes == ["done"]
    final = await cluster.run(record.id)
    assert (final.state, final.output) == (RunState.SUCCEEDED, "finished by a")
    assert cluster.model.calls == 2 and gate.calls == 1
    check_journal(await cluster.events(record.id))


async def test_a_worker_past_its_deadline_goes_on_if_the_store_renews_its_lease_then(
    cluster: Cluster,
) -> None:
    # A worker whose renewals failed for a lease's length (or that stalled that long) has
    # not necessarily lost the run: nobody claimed it here, and the renewal asked for
    # before the next step succeeds, so the run goes on.
    lease_seconds = 30.0
    await cluster.store.apply(load_text(GATED, "gated.yaml"))
    cluster.model.add_reply(
        FakeReply(tool_calls=[FakeToolCall("wait_at_gate", {"gate": "g"})]),
        FakeReply(text="finished by a"),
    )
    gate = GATES["g"] = Gate()
    record, _ = await submit_run(cluster.store, "gatekeeper", "go")
    settings = Settings(home=cluster.home, db_url=f"sqlite:///{cluster.db_path}", secret_key=None)
    stalled = await RenewalsStall.open(
        f"sqlite:///{cluster.db_path}", cipher=SecretCipher(key=SecretCipher.generate_key())
    )
    stalled.hang = False
    clock = FakeClock()
    outcomes: list[str] = []
    try:
        [(claimed, lease)] = await stalled.claim_runs("a", lease_seconds)
        a = RunExecutor(stalled, settings, lease_seconds=lease_seconds, clock=clock)

        async def execute_a() -> None:
            outcomes.append(await a.execute(claimed, lease))

        async with a, anyio.create_task_group() as group:
            group.start_soon(execute_a)
            with anyio.fail_after(TIMEOUT):
                await gate.arrived.wait()
            clock.advance(lease_seconds + 1)
            with anyio.fail_after(TIMEOUT):
                await clock.sleeping()  # the renewal due meanwhile failed: a backs off
            stalled.stalled = False  # the store is back
            gate.opened.set()
    finally:
        GATES.pop("g", None)
        await stalled.close()
    assert outcomes == ["done"]
    final = await cluster.run(record.id)
    assert (final.state, final.output) == (RunState.SUCCEEDED, "finished by a")
    assert cluster.model.calls == 2 and gate.calls == 1
    check_journal(await cluster.events(record.id))


@pytest.mark.parametrize("tool", ["perform_exec", "perform"])
async def test_sigterm_drains_releases_the_run_and_another_worker_resumes_it(
    cluster: Cluster, tool: str
) -> None:
    cluster.model.add_reply(call(tool, "long", 30), FakeReply(text="resumed"))
    run_id = await submit(cluster, "a long job")
    a = cluster.start_worker("a", lease=5.0, grace=1.0)
    await cluster.wait_for_effect("long")  # the call is in its slow part
    await cluster.wait_for_event(run_id, EventType.TOOL_CALL)  # journaled before
    a.signal(signal.SIGTERM)
    # grace (1 s), then the call is interrupted and the run released; a synchronous
    # python function cannot be interrupted, and the worker exits without waiting for it
    assert await a.exited(timeout=5) == 0
    output = a.output()
    # at start-up it said how its tools are isolated (once), then what it does on SIGTERM
    assert output.count("tool isolation: ") == 1
    # the worker says what it does on SIGTERM: draining, releasing, stopped
    assert "SIGTERM received: no new runs; stopping" in output
    assert "stopping: draining 1 runs (up to 1 s)" in output
    assert "releasing 1 unfinished runs" in output
    assert f"run {run_id} (agent " in output and "released after" in output
    assert "another worker resumes it from its journal" in output
    assert "stopped: 1 runs executed, 1 released to other workers" in output
    released = await cluster.run(run_id)
    assert released.state is RunState.QUEUED
    assert (released.lease_owner, released.lease_expires_at) == (None, None)
    assert released.attempts == 0  # a shutdown is no failed attempt: a's is given back

    cluster.start_worker("b")
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)
    assert record.output == "resumed" and record.attempts == 1
    assert cluster.invocations() == ["long", "long"]
    assert list(cluster.effects().values()) == ["long"]
    assert cluster.model.calls == 2
    check_journal(await cluster.events(run_id))


async def test_run_journaled_to_its_end_but_never_saved_is_completed_from_its_journal(
    cluster: Cluster,
) -> None:
    # What a worker killed between its last journal write and save_run leaves behind:
    # the run still `running` under an expiring lease, its events complete.
    run_id = await submit(cluster, "hi")
    [(_, lease)] = await cluster.store.claim_runs("killed-worker", 0.5)
    answer = Message.assistant("journaled answer")
    usage = {"input_tokens": 10, "output_tokens": 5, "requests": 1}
    journal: list[tuple[EventType, dict[str, Any]]] = [
        (
            EventType.RUN_START,
            {"agent": "clerk", "input": "hi", "messages": [dump(Message.user("hi"))]},
        ),
        (EventType.STEP_START, {"step": 1}),
        (
            EventType.MESSAGE_CREATE,
            {"step": 1, "message": dump(answer), "usage": usage, "cost_usd": 0.0},
        ),
        (EventType.STEP_FINISH, {"step": 1, "usage": usage, "cost_usd": 0.0}),
        (EventType.RUN_FINISH, {"state": "succeeded", "output": "journaled answer", "steps": 1}),
    ]
    events = [
        Event(run_id, seq, parse_event_data(type, data))
        for seq, (type, data) in enumerate(journal, 1)
    ]
    await cluster.store.append_events(events, lease=lease)

    cluster.start_worker("b", lease=1.0)
    record = await cluster.wait_for_state(run_id, RunState.SUCCEEDED)

    assert (record.output, record.steps) == ("journaled answer", 1)
    assert cluster.model.calls == 0
    stored = await cluster.events(run_id)
    check_journal(stored)
    assert stored == events
