"""Scale-out: ``corral worker`` processes on PostgreSQL + NATS JetStream, killed for real.

Two parts. Every durable-runs test of :mod:`test_durability` (SIGKILL mid-tool
and mid-model-call, an interrupted call approved across restarts, SIGSTOP past
the lease, a refused write in parallel calls, SIGTERM drain and release, a run
journaled to its end but never saved) runs again here on a PostgreSQL database and the shared
NATS server: submits are announced, workers take runs from NATS and sweep the
store only every second.

Then the fault run: 3 workers, 300 tasks whose tool performs a side effect
per idempotency key; one worker is SIGKILLed twice (and replaced), the NATS
server is crashed and restarted once (a server of the test's own: the shared
one serves other tests), and every PostgreSQL connection to the test's
database is terminated once. Every task must end ``succeeded`` with one
``run.finish``, one side effect per task, every repeated tool execution made by
a worker that was killed, and nothing left running or leased.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import pytest

from corral.bus.nats import NatsBus
from corral.core.events import EventType
from corral.core.runs import RunState
from corral.resources.loader import load_text
from corral.runtime.operations import submit as submit_run
from corral.store import open_store
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply
from databases import PostgresServer
from nats_servers import (
    NatsServerProcess,
    nats_prefix_fixture,
    nats_server_url_fixture,
    new_prefix,
    private_nats_fixture,
)
from server_harness import sse_messages
from test_durability import (
    Cluster,
    WorkerProcess,
    call,
    check_journal,
    fake_openai_fixture,
    openai_server_fixture,
    resources,
    test_a_write_refused_inside_parallel_tool_calls_counts_as_a_lost_lease,
    test_interrupted_non_idempotent_call_waits_for_a_human_before_running_again,
    test_run_journaled_to_its_end_but_never_saved_is_completed_from_its_journal,
    test_sigkill_during_a_model_call_does_not_repeat_the_journaled_one,
    test_sigkill_during_an_idempotent_tool_call_reruns_it_without_a_second_effect,
    test_sigterm_drains_releases_the_run_and_another_worker_resumes_it,
    test_stalled_worker_past_its_lease_cannot_commit_after_another_finished,
)

__all__ = [
    "fake_openai_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "openai_server_fixture",
    "private_nats_fixture",
    "test_a_write_refused_inside_parallel_tool_calls_counts_as_a_lost_lease",
    "test_interrupted_non_idempotent_call_waits_for_a_human_before_running_again",
    "test_run_journaled_to_its_end_but_never_saved_is_completed_from_its_journal",
    "test_sigkill_during_a_model_call_does_not_repeat_the_journaled_one",
    "test_sigkill_during_an_idempotent_tool_call_reruns_it_without_a_second_effect",
    "test_sigterm_drains_releases_the_run_and_another_worker_resumes_it",
    "test_stalled_worker_past_its_lease_cannot_commit_after_another_finished",
]

TESTS = Path(__file__).parent
#: seconds a dispatched run may go without a sign of life before NATS delivers it again
ACK_WAIT = 2.0


@dataclass
class ScaleOutCluster(Cluster):
    """A :class:`Cluster` whose workers run on PostgreSQL and NATS."""

    db_url: str = ""
    nats_url: str = ""
    prefix: str = ""

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update(
            CORRAL_DB_URL=self.db_url,
            CORRAL_NATS_URL=self.nats_url,
            CORRAL_NATS_PREFIX=self.prefix,
            CORRAL_NATS_ACK_WAIT_SECONDS=str(ACK_WAIT),
            CORRAL_DB_POOL_SIZE="4",
        )
        return env

    def start_worker(
        self,
        name: str,
        *,
        lease: float = 2.0,
        grace: float = 30.0,
        poll: float = 1.0,
        concurrency: int = 1,
    ) -> WorkerProcess:
        """As :meth:`Cluster.start_worker`, sweeping the store only every ``poll`` seconds
        (runs come from NATS in between)."""
        log = self.home / f"worker-{name}.log"
        argv = [sys.executable, "-m", "corral", "worker", "--concurrency", str(concurrency)]
        argv += ["--lease-seconds", str(lease), "--grace-seconds", str(grace)]
        argv += ["--poll-seconds", str(poll)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, env=self.environment(), cwd=self.home, stdout=out, stderr=subprocess.STDOUT
            )
        worker = WorkerProcess(name, process, log)
        self.workers.append(worker)
        return worker


@pytest.fixture
async def cluster(
    tmp_path: Path,
    fake_openai: FakeOpenAIServer,
    postgres: PostgresServer,
    nats_server_url: str,
    nats_prefix: str,
) -> AsyncIterator[ScaleOutCluster]:
    """The durable-runs cluster of :mod:`test_durability`, on PostgreSQL + the shared NATS."""
    home = tmp_path / "home"
    (home / "durable" / "effects").mkdir(parents=True)
    database = postgres.create(migrated=True)
    url = postgres.url(database)
    store = await open_store(url)
    await store.apply(load_text(resources(fake_openai.base_url, home / "durable"), "durable.yaml"))
    bus = await NatsBus.connect(nats_server_url, prefix=nats_prefix, ack_wait_seconds=ACK_WAIT)
    created = ScaleOutCluster(
        home, store, fake_openai, bus=bus, db_url=url, nats_url=nats_server_url, prefix=nats_prefix
    )
    try:
        yield created
    finally:
        created.kill_all()
        await bus.close()
        await store.close()
        postgres.drop(database)


# --------------------------------------------------------------------------- the fault run

TASKS = 300
WORKERS = 3
CONCURRENCY = 4
#: how long each tool call takes after its effect: long enough to be cut off by a kill
TOOL_SECONDS = 0.3
#: how often the workers sweep the store (runs come from NATS in between)
SWEEP = 2.0
#: the whole run's deadline (the test as a whole stays under two minutes)
FAULT_TIMEOUT = 100.0


def fault_resources(durable_dir: Path) -> str:
    """A scripted model (turn 1: call the tool; turn 2: answer) and the idempotent tool."""
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: script}}
spec:
  provider: scripted
  script:
    - {{tool_calls: [{{name: perform, arguments: {{label: effect, seconds: {TOOL_SECONDS}}}}}]}}
    - {{text: done}}
---
apiVersion: corral/v1
kind: Tool
metadata: {{name: perform}}
spec:
  type: python
  python: {{function: "durable_tools:perform_once", path: "{TESTS}"}}
  idempotent: true
  timeout_seconds: 30
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: clerk}}
spec:
  model: script
  tools: [perform]
  max_attempts: 10
"""


@dataclass
class FaultRun:
    """The fault run's cluster, with the NATS server it restarts and the faults it made."""

    cluster: ScaleOutCluster
    nats: NatsServerProcess
    database: str
    postgres: PostgresServer
    bus: NatsBus
    killed_pids: set[int] = field(default_factory=set[int])
    terminated: int = 0

    async def succeeded(self) -> int:
        counts = await self.cluster.store.count_runs()
        return counts.by_state.get(("default", RunState.SUCCEEDED), 0)

    async def wait_for_successes(self, n: int) -> None:
        deadline = time.monotonic() + FAULT_TIMEOUT
        while await self.succeeded() < n:
            assert time.monotonic() < deadline, f"fewer than {n} runs succeeded in time"
            await anyio.sleep(0.1)

    async def leases_of(self, worker: WorkerProcess) -> int:
        """How many runs ``worker`` holds right now."""
        marker = f":{worker.process.pid}:"
        running = await self.cluster.store.list_runs(
            "default", limit=TASKS, states=[RunState.RUNNING]
        )
        return sum(1 for r in running if r.lease_owner is not None and marker in r.lease_owner)

    async def kill_busy(self, worker: WorkerProcess) -> None:
        """SIGKILL ``worker`` while it holds runs (in their tool calls, most likely)."""
        deadline = time.monotonic() + 20
        while await self.leases_of(worker) == 0:
            if time.monotonic() > deadline:
                worker.signal(signal.SIGABRT)  # its log ends with where every thread was
                await anyio.sleep(1)
                raise AssertionError(f"worker {worker.name} never held a run:\n{worker.output()}")
            await anyio.sleep(0.02)
        worker.signal(signal.SIGKILL)
        assert await worker.exited() == -signal.SIGKILL
        self.killed_pids.add(worker.process.pid)

    async def terminate_connections(self) -> int:
        """``pg_terminate_backend`` every session on the test's database but this one."""
        rows = await self.postgres.admin(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            f" WHERE datname = '{self.database}' AND pid <> pg_backend_pid()"
        )
        return int(rows[0][0])


@pytest.fixture
async def fault_run(
    tmp_path: Path,
    fake_openai: FakeOpenAIServer,
    postgres: PostgresServer,
    private_nats: NatsServerProcess,
) -> AsyncIterator[FaultRun]:
    home = tmp_path / "home"
    (home / "durable" / "effects").mkdir(parents=True)
    database = postgres.create(migrated=True)
    url = postgres.url(database)
    store = await open_store(url)
    await store.apply(load_text(fault_resources(home / "durable"), "fault.yaml"))
    prefix = new_prefix()
    bus = await NatsBus.connect(private_nats.url, prefix=prefix, ack_wait_seconds=ACK_WAIT)
    cluster = ScaleOutCluster(
        home, store, fake_openai, bus=bus, db_url=url, nats_url=private_nats.url, prefix=prefix
    )
    run = FaultRun(cluster, private_nats, database, postgres, bus)
    try:
        yield run
    finally:
        cluster.kill_all()
        await bus.close()
        await store.close()
        postgres.drop(database)


async def test_fault_run_every_task_succeeds_once_with_exact_side_effects(
    fault_run: FaultRun,
) -> None:
    cluster, started = fault_run.cluster, time.monotonic()
    workers = [
        cluster.start_worker(f"w{i}", concurrency=CONCURRENCY, lease=2.0, poll=SWEEP)
        for i in range(WORKERS)
    ]
    ids: list[str] = []
    for i in range(TASKS - 50):
        record, _ = await submit_run(cluster.store, "clerk", f"task {i}", bus=fault_run.bus)
        ids.append(record.id)

    # 1. SIGKILL a worker in the middle of its runs, and replace it.
    await fault_run.wait_for_successes(30)
    await fault_run.kill_busy(workers[0])
    workers[0] = cluster.start_worker("w0-again", concurrency=CONCURRENCY, lease=2.0, poll=SWEEP)

    # 2. Crash NATS; submit the last 50 tasks while it is down (their announcements are
    #    lost: the store sweep finds them), then start it again in place.
    await fault_run.wait_for_successes(80)
    await anyio.to_thread.run_sync(fault_run.nats.stop)
    while fault_run.bus.client.is_connected:
        await anyio.sleep(0.01)
    for i in range(TASKS - 50, TASKS):
        record, _ = await submit_run(cluster.store, "clerk", f"task {i}", bus=fault_run.bus)
        ids.append(record.id)
    await anyio.sleep(1.0)
    await anyio.to_thread.run_sync(fault_run.nats.start)

    # 3. Terminate every PostgreSQL connection of the workers (and of this process).
    await fault_run.wait_for_successes(150)
    fault_run.terminated = await fault_run.terminate_connections()
    assert fault_run.terminated >= WORKERS  # each worker had at least one connection

    # 4. SIGKILL the same worker (its replacement) again, and replace it again.
    await fault_run.wait_for_successes(200)
    await fault_run.kill_busy(workers[0])
    workers[0] = cluster.start_worker("w0-third", concurrency=CONCURRENCY, lease=2.0, poll=SWEEP)

    await fault_run.wait_for_successes(TASKS)
    elapsed = time.monotonic() - started

    # Every task ended succeeded, exactly once, and nothing is left running or leased.
    runs = await cluster.store.list_runs("default", limit=TASKS + 10)
    assert len(runs) == TASKS and {r.id for r in runs} == set(ids)
    assert Counter(r.state for r in runs) == {RunState.SUCCEEDED: TASKS}
    assert all(r.output == "done" and r.lease_owner is None for r in runs)
    assert all(r.lease_expires_at is None for r in runs)
    keys: list[str] = []
    for run in runs:
        events = await cluster.events(run.id)
        check_journal(events)  # one run.start, one run.finish, gap-free, one answer per step
        assert [e.data.step for e in events if e.type is EventType.MESSAGE_CREATE] == [1, 2]
        keys.append(f"{run.id}:1:0")

    # One side effect per task, under its own idempotency key.
    effects = cluster.effects()
    assert sorted(effects) == sorted(key.replace(":", "_") for key in keys)
    assert set(effects.values()) == {"effect"}
    # Executions, counted honestly. The tool is idempotent, so its tool.call is written
    # behind (the call runs while the commit is in flight) and a call a worker's death cut
    # off runs again under the same key. So: every task's call ran at least once, and every
    # execution but the last of a key was made by a worker that was then SIGKILLed - at
    # most CONCURRENCY calls per kill. Nothing else ever ran a call twice.
    by_key: dict[str, list[int]] = {}
    for line in (cluster.durable_dir / "invocations.log").read_text().splitlines():
        key, _, pid, _ = line.split()
        by_key.setdefault(key, []).append(int(pid))
    assert set(by_key) == set(keys)
    repeated = {key: pids for key, pids in by_key.items() if len(pids) > 1}
    assert all(set(pids[:-1]) <= fault_run.killed_pids for pids in repeated.values()), repeated
    reruns = sum(len(pids) - 1 for pids in repeated.values())
    assert reruns <= len(fault_run.killed_pids) * CONCURRENCY

    # Every dispatch was settled and none dead-lettered. (The stream itself may keep a few
    # messages its consumer had acknowledged just before the crash: a server killed
    # between the two writes. They are never delivered again, and age out.)
    async def consumer_settled() -> bool:
        info = await fault_run.bus.js.consumer_info(fault_run.bus.stream, "workers")
        return info.num_pending == 0 and info.num_ack_pending == 0

    deadline = time.monotonic() + 4 * ACK_WAIT + 5
    while not await consumer_settled():
        assert time.monotonic() < deadline, "dispatches left unsettled"
        await anyio.sleep(0.2)
    dead = await fault_run.bus.js.stream_info(fault_run.bus.dead_stream)
    assert dead.state.messages == 0
    orphans = (await fault_run.bus.js.stream_info(fault_run.bus.stream)).state.messages

    # The workers rode out every fault: alive, no traceback, and they stop cleanly.
    for worker in workers:
        assert worker.process.poll() is None, worker.output()[-3000:]
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert await worker.exited(timeout=40) == 0
    for worker in cluster.workers:
        assert "Traceback" not in worker.output(), worker.output()[-3000:]
    summaries = [line for w in workers for line in w.output().splitlines() if "deliveries" in line]
    taken = [[int(n) for n in re.findall(r"(\d+) (?:runs taken|found)", s)] for s in summaries]
    assert len(taken) == WORKERS and sum(d for d, _ in taken) > 0
    print(
        f"\nfault run: {TASKS} tasks in {elapsed:.1f} s; {len(fault_run.killed_pids)} SIGKILLs, "
        f"1 NATS restart, {fault_run.terminated} connections terminated; "
        f"{reruns} calls cut off and run again; {orphans} acknowledged "
        "dispatches left in the stream by the crash; the last workers took "
        f"{sum(d for d, _ in taken)} runs from NATS and {sum(w for _, w in taken)} by sweeping"
    )


# --------------------------------------------------------------------------- two API replicas


@dataclass
class ApiReplica:
    """A ``corral serve --workers 0`` subprocess of the cluster (PostgreSQL + NATS)."""

    process: subprocess.Popen[bytes]
    url: str

    @classmethod
    def start(cls, cluster: ScaleOutCluster, name: str) -> ApiReplica:
        from nats_servers import free_port

        port = free_port()
        log = cluster.home / f"serve-{name}.log"
        argv = [sys.executable, "-m", "corral", "serve", "--workers", "0", "--port", str(port)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, env=cluster.environment(), cwd=cluster.home, stdout=out, stderr=out
            )
        return cls(process, f"http://127.0.0.1:{port}")

    async def ready(self, http: httpx.AsyncClient) -> None:
        with anyio.fail_after(30):
            while True:
                assert self.process.poll() is None, "the API replica exited"
                try:
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def test_a_follower_on_one_api_replica_sees_the_run_driven_through_another(
    cluster: ScaleOutCluster,
) -> None:
    """Submit through replica B, follow on replica A, execute on a worker: three processes
    that share only PostgreSQL and NATS. A's stream is every stored event, in order, once."""
    cluster.model.add_reply(
        call("perform", "one", 0.5), call("perform", "two", 0.5), FakeReply(text="both done")
    )
    cluster.start_worker("w")
    replicas: list[ApiReplica] = []
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            replicas.append(ApiReplica.start(cluster, "a"))
            await replicas[0].ready(http)  # the first start writes the admin token
            replicas.append(ApiReplica.start(cluster, "b"))
            await replicas[1].ready(http)
            a, b = replicas
            token = (cluster.home / "admin.token").read_text().strip()
            auth = {"Authorization": f"Bearer {token}"}

            submitted = await http.post(
                f"{b.url}/v1/tasks", json={"agent": "clerk", "input": "go"}, headers=auth
            )
            assert submitted.status_code in (200, 201), submitted.text
            run_id = submitted.json()["id"]

            seen: list[tuple[int, str]] = []
            final: str | None = None
            stream_headers = {**auth, "Accept": "text/event-stream"}
            async with http.stream(
                "GET", f"{a.url}/v1/runs/{run_id}/events", headers=stream_headers
            ) as stream:
                assert stream.status_code == 200
                lines = [line async for line in _until_end(stream.aiter_lines())]
            for message in sse_messages(iter(lines)):
                if message.get("event") == "end":
                    final = json.loads(message["data"])["state"]
                elif "id" in message:
                    seen.append((int(message["id"]), message["event"]))
    finally:
        for replica in replicas:
            replica.stop()

    stored = await cluster.store.list_events(run_id)
    assert seen == [(e.seq, e.type.value) for e in stored]
    assert final == RunState.SUCCEEDED.value
    record = await cluster.store.get_run(run_id)
    assert record is not None and record.output == "both done"
    assert {e.data.tool for e in stored if e.type is EventType.TOOL_RESULT} == {"perform"}


async def _until_end(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The lines of an event stream up to and including its ``end`` message."""
    ended = False
    async for line in lines:
        yield line
        if line == "event: end":
            ended = True
        elif ended and not line:
            return
