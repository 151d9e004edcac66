"""Workers in this process: claims, approvals, retries, dead letter, cancellation and sessions.

Every test runs twice (:mod:`backends`): on the embedded SQLite store with the
in-process bus, and on PostgreSQL + NATS JetStream, where the worker takes runs
from NATS deliveries and does not sweep the store while the test runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from backends import Backend, backend_fixture, deployment_fixture
from corral.core.events import ErrorData, Event, EventType, RunStartData
from corral.core.ids import new_id
from corral.core.runs import ApprovalState, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.loader import load_text
from corral.runtime.executor import RunExecutor
from corral.runtime.operations import submit
from corral.runtime.worker import Worker
from corral.store import Store, open_store
from corral.store.base import StoreError
from corral.testing.fake_openai import FakeOpenAIServer, FakeReply
from corral.tools.sandbox.host import SandboxHost
from databases import on_database
from fake_clock import FakeClock
from fixtures_models import fake_openai_fixture, openai_server_fixture
from nats_servers import nats_prefix_fixture, nats_server_url_fixture
from sandboxing import require_bwrap

__all__ = [
    "backend_fixture",
    "deployment_fixture",
    "fake_openai_fixture",
    "nats_prefix_fixture",
    "nats_server_url_fixture",
    "openai_server_fixture",
]

TESTS = Path(__file__).parent


def scripted(*turns: str) -> str:
    body = "\n".join(f"    - {t}" for t in turns)
    return f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: script}}
spec:
  provider: scripted
  script:
{body}
"""


NOTE_TOOL = f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: note}}
spec:
  type: python
  python: {{function: "agent_tools:record_side_effect", path: "{TESTS}"}}
  risk: high
"""


def agent(model: str = "script", extra: str = "") -> str:
    return f"""
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec:
  model: {model}
  tools: [note]
{extra}"""


@pytest.fixture(autouse=True)
def side_effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The note tool records its side effects in the test's directory (see :func:`effects`)."""
    monkeypatch.setenv("CORRAL_TEST_SIDE_EFFECTS", str(tmp_path / "effects.txt"))


@pytest.fixture
async def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Store]:
    """A SQLite store (for the tests of other modules: these take a ``backend``)."""
    monkeypatch.setenv("CORRAL_TEST_SIDE_EFFECTS", str(tmp_path / "effects.txt"))
    opened = await open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'corral.db'}", secret_key=None)


async def apply(store: Store, *docs: str) -> None:
    await store.apply(load_text("---".join(docs), "t.yaml"))


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


async def get(store: Store, run: RunRecord) -> RunRecord:
    stored = await store.get_run(run.id)
    assert stored is not None
    return stored


async def test_worker_executes_queued_runs_once(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: hi}}]}", "{text: done}"),
        NOTE_TOOL,
        agent(),
    )
    runs = [(await backend.submit("helper", f"task {i}"))[0] for i in range(3)]
    worker = await backend.drain()
    assert worker.executed == 3
    for run in runs:
        stored = await get(store, run)
        assert (stored.state, stored.output, stored.attempts) == (RunState.SUCCEEDED, "done", 1)
        assert stored.lease_owner is None
    assert effects(tmp_path) == ["hi", "hi", "hi"]


async def test_approval_survives_in_the_store_and_the_approved_call_runs_once(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.runtime.worker")
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: wired}}]}", "{text: paid}"),
        NOTE_TOOL,
        agent(extra="  approval: {policy: by_risk, min_risk: high}"),
    )
    run, _ = await backend.submit("helper", "pay the bill")
    await backend.drain()
    assert (await get(store, run)).state is RunState.WAITING_APPROVAL
    [approval] = await store.list_approvals("default", states=["pending"])
    assert (approval.tool, approval.run_id) == ("note", run.id)
    assert effects(tmp_path) == []

    await backend.decide(approval.id, True, by="tester")
    await backend.drain()
    stored = await get(store, run)
    assert (stored.state, stored.output) == (RunState.SUCCEEDED, "paid")
    assert effects(tmp_path) == ["wired"]
    events = await store.list_events(run.id)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.APPROVAL_REQUESTED) == 1
    assert kinds.count(EventType.APPROVAL_RESOLVED) == 1
    # the decision is journaled with who took it, when, and which approval it was
    [resolved] = [e.data.to_dict() for e in events if e.type is EventType.APPROVAL_RESOLVED]
    [decided] = await store.list_approvals(run_id=run.id)
    assert resolved["tool"] == "note" and resolved["approved"] is True
    assert (resolved["by"], resolved["decided_at"]) == ("tester", decided.decided_at)
    assert resolved["approval_id"] == approval.id and "expired" not in resolved
    # the worker said what came of each execution: agent, state, duration
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"run {run.id}")]
    assert len(lines) == 2, lines
    assert re.fullmatch(
        rf"run {run.id} \(agent helper\): waiting_approval in \d+\.\d\d s, 1 step\(s\), "
        r"1 call\(s\) wait for approval",
        lines[0],
    )
    assert re.fullmatch(
        rf"run {run.id} \(agent helper\): succeeded in \d+\.\d\d s, 2 step\(s\)", lines[1]
    )


async def test_a_run_paused_for_approval_more_often_than_max_attempts_still_finishes(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.store
    call = "{tool_calls: [{name: note, arguments: {note: x}}]}"
    await apply(
        store,
        scripted(call, call, call, call, "{text: all noted}"),
        NOTE_TOOL,
        agent(extra="  approval: {policy: always}\n  max_attempts: 2"),
    )
    run, _ = await backend.submit("helper", "note four times")
    for _ in range(4):
        await backend.drain()
        assert (await get(store, run)).state is RunState.WAITING_APPROVAL
        [approval] = await store.list_approvals(run_id=run.id, states=["pending"])
        await backend.decide(approval.id, True, by="tester")
    await backend.drain()
    stored = await get(store, run)
    assert (stored.state, stored.output, stored.error) == (RunState.SUCCEEDED, "all noted", None)
    assert stored.attempts == 1 and effects(tmp_path) == ["x"] * 4


async def test_rejected_call_is_told_to_the_model(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: x}}]}", "{text: ok}"),
        NOTE_TOOL,
        agent(extra="  approval: {policy: always}"),
    )
    run, _ = await backend.submit("helper", "go")
    await backend.drain()
    [approval] = await store.list_approvals(run_id=run.id)
    decided = await backend.decide(approval.id, False, reason="not today")
    assert decided.state is ApprovalState.REJECTED
    await backend.drain()
    stored = await get(store, run)
    assert stored.state is RunState.SUCCEEDED and effects(tmp_path) == []
    tool_message = next(m for m in stored.messages if m.role == "tool")
    assert "approval_rejected" in tool_message.content and "not today" in tool_message.content


@pytest.mark.worker(retry_base_seconds=0.01)
async def test_an_attempt_that_raises_is_retried_then_dead_letters_with_its_cause(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.store
    answer = "{text: '{\"sum\": 5}'}"
    await apply(store, scripted(*[answer] * 6), NOTE_TOOL, agent(extra="  max_attempts: 3"))
    # An output schema the engine cannot use (stored past the checks of submit and apply,
    # as an older version did): every attempt raises at its end, in the worker.
    run = RunRecord(
        id=new_id("run"),
        namespace="default",
        agent="helper",
        input="2 + 3?",
        output_schema={"type": "objectx"},
    )
    await store.submit_run(run)
    await backend.bus.announce_runnable([run.id], mark="submitted")
    with anyio.fail_after(20):
        while not (stored := await get(store, run)).state.finished:
            await backend.drain()
            clock.advance(1.0)  # past the retry's backoff
    assert stored.state is RunState.DEAD_LETTER
    assert (stored.attempts, stored.max_attempts) == (3, 3)
    assert stored.error is not None and stored.error["code"] == "internal_error"
    assert "UnknownType" in stored.error["message"] and "objectx" in stored.error["message"]
    events = await store.list_events(run.id)
    # (each attempt failed before its first journal write: no retry error could be journaled)
    assert [e.type for e in events] == [EventType.RUN_START, EventType.ERROR, EventType.RUN_FINISH]
    assert events[1].data.to_dict() == stored.error and events[-1].data.state == "dead_letter"


async def test_a_run_whose_workers_kept_stopping_ends_at_max_attempts_with_the_last_error(
    store: Store, settings: Settings
) -> None:
    await apply(store, scripted("{text: never asked}"), NOTE_TOOL, agent(extra="  max_attempts: 2"))
    run = RunRecord(id=new_id("run"), namespace="default", agent="helper", input="hi")
    run.max_attempts = 2  # (store.submit_run takes it from the record, not the Agent)
    await store.submit_run(run)
    # Two workers claimed it and died (their leases expired, as of the clock passed in);
    # the first journaled a retryable error before it did.
    past = time.time() - 100
    [(_, lease)] = await store.claim_runs("dead-1", 1.0, now=past)
    error = {"code": "model_error", "message": "upstream answered 503", "retry": 2}
    start = Event(run.id, 1, RunStartData(agent="helper", input="hi"))
    await store.append_events([start, Event(run.id, 2, ErrorData.of(error))], lease)
    assert len(await store.claim_runs("dead-2", 1.0, now=past + 10)) == 1

    await Worker(store, settings, poll_seconds=0.05).serve(anyio.Event(), until_idle=True)

    stored = await get(store, run)
    assert stored.state is RunState.DEAD_LETTER
    assert (stored.attempts, stored.max_attempts) == (2, 2)  # the burying claim is no attempt
    assert stored.error is not None
    assert "kept stopping" in stored.error["message"]
    assert "upstream answered 503" in stored.error["message"]
    assert stored.error["cause"] == {"code": "model_error", "message": "upstream answered 503"}


async def test_a_run_its_workers_released_on_shutdown_more_often_than_max_attempts_finishes(
    backend: Backend,
) -> None:
    store = backend.store
    await apply(store, scripted("{text: done}"), NOTE_TOOL, agent(extra="  max_attempts: 2"))
    run = RunRecord(id=new_id("run"), namespace="default", agent="helper", input="hi")
    run.max_attempts = 2  # (store.submit_run takes it from the record, not the Agent)
    await store.submit_run(run)
    # Rolling restarts: each worker that claims it is told to shut down and releases it.
    stopping = anyio.Event()
    stopping.set()
    async with RunExecutor(store, backend.settings) as executor:  # no bus: nothing announced
        for _ in range(5):
            [(record, lease)] = await store.claim_runs("restarting", 30.0, run_ids=[run.id])
            assert await executor.execute(record, lease, stopping) == "released"
            assert (await get(store, run)).attempts == 0  # a shutdown is no failed attempt
    await backend.bus.announce_runnable([run.id], mark="submitted")
    await backend.drain()
    stored = await get(store, run)
    assert (stored.state, stored.output, stored.attempts) == (RunState.SUCCEEDED, "done", 1)


async def test_worker_shutdown_kills_a_daemon_its_exec_tool_started(
    store: Store, settings: Settings
) -> None:
    probe = TESTS / "tool_programs" / "probe.py"
    await apply(
        store,
        scripted("{tool_calls: [{name: daemon, arguments: {mode: daemon}}]}", "{text: done}"),
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: daemon}}
spec:
  type: exec
  # unsandboxed: the test follows the daemon by its host pid (the sandboxed case is below)
  exec: {{command: ["{sys.executable}", "{probe}"], isolation: {{mode: none}}}}
  parameters: {{type: object}}
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec: {{model: script, tools: [daemon]}}
""",
    )
    run, _ = await submit(store, "helper", "start it")
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(Worker(store, settings, poll_seconds=0.05, grace_seconds=0).serve, stop)
        with anyio.fail_after(20):  # the tool's program writes it once the daemon runs
            while not (written := list(settings.workspaces.rglob("daemon.txt"))):
                await anyio.sleep(0.02)
            while not (text := written[0].read_text()):
                await anyio.sleep(0.02)
        daemon = int(text)
        assert Path(f"/proc/{daemon}").exists() and os.getsid(daemon) == daemon
        stop.set()
    assert (await get(store, run)).state is RunState.QUEUED  # released for another worker
    with anyio.fail_after(5):  # dead and reaped
        while Path(f"/proc/{daemon}").exists():
            await anyio.sleep(0.02)


def _with_token(token: str) -> list[int]:
    """The host pids of processes whose command line holds ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


async def test_worker_shutdown_kills_a_sandboxed_tools_daemon(
    store: Store, settings: Settings
) -> None:
    require_bwrap(SandboxHost.from_env())
    hostile = TESTS / "tool_programs" / "hostile.py"
    token = f"corral-worker-daemon-{secrets.token_hex(6)}"
    await apply(
        store,
        scripted(
            f"{{tool_calls: [{{name: daemon, arguments: {{mode: daemon, token: {token}}}}}]}}",
            "{text: done}",
        ),
        f"""
apiVersion: corral/v1
kind: Tool
metadata: {{name: daemon}}
spec:
  type: exec
  exec: {{command: ["{sys.executable}", "{hostile}"], isolation: {{mode: sandbox}}}}
  parameters: {{type: object}}
  timeout_seconds: 60
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: helper}}
spec: {{model: script, tools: [daemon]}}
""",
    )
    run, _ = await submit(store, "helper", "start it")
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(Worker(store, settings, poll_seconds=0.05, grace_seconds=0).serve, stop)
        with anyio.fail_after(20):  # the setsid() daemon runs, seen from the host
            while not _with_token(token):
                await anyio.sleep(0.02)
        stop.set()
    assert (await get(store, run)).state is RunState.QUEUED
    with anyio.fail_after(5):  # the sandbox's whole PID namespace is gone
        while _with_token(token):
            await anyio.sleep(0.02)


@pytest.mark.worker(retry_base_seconds=0.01)
async def test_retryable_failures_retry_then_dead_letter(
    backend: Backend,
    fake_openai: FakeOpenAIServer,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="corral.runtime.worker")
    store = backend.store
    fake_openai.fail(503, times=None)
    await store.apply(
        load_text(
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: flaky}}
spec:
  provider: openai
  model: m
  base_url: {fake_openai.base_url}
  retry: {{max_attempts: 1}}
---
{NOTE_TOOL}
---
{agent("flaky", "  max_attempts: 3")}
""",
            "t.yaml",
        )
    )
    run, _ = await backend.submit("helper", "hi")
    with anyio.fail_after(20):
        # On SQLite each drain stops while the run waits out its backoff; with NATS the
        # released run is announced again, and its delivery comes back when it is due.
        while not (stored := await get(store, run)).state.finished:
            await backend.drain()
            clock.advance(1.0)  # past the retry's backoff
    assert stored.state is RunState.DEAD_LETTER
    assert stored.attempts == 3 and fake_openai.calls == 3
    assert stored.error is not None and stored.error["status_code"] == 503
    events = await store.list_events(run.id)
    errors = [e.data.to_dict() for e in events if e.type is EventType.ERROR]
    assert [e.get("retry") for e in errors][:2] == [2, 3]
    # each retry is journaled with how many attempts there are and when the next comes
    assert [e.get("max_attempts") for e in errors][:2] == [3, 3]
    assert all(0 <= e["retry_in"] <= 60 for e in errors[:2])
    assert "retry" not in errors[-1] and "retry_in" not in errors[-1]
    assert events[-1].data.state == "dead_letter"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"run {run.id}")]
    released = "(the attempt failed; it is retried after a backoff)"
    assert [line.endswith(released) for line in lines] == [True, True, False], lines
    assert re.match(rf"run {run.id} \(agent helper\): dead_letter in .*: model_error: ", lines[2])


async def test_idempotency_key_returns_the_same_task(backend: Backend) -> None:
    store = backend.store
    await store.apply(load_text("---".join([scripted("{text: x}"), NOTE_TOOL, agent()]), "t.yaml"))
    first, created = await backend.submit("helper", "a", idempotency_key="k1")
    again, created_again = await backend.submit("helper", "a", idempotency_key="k1")
    assert created and not created_again and again.id == first.id
    worker = await backend.drain()
    assert worker.executed == 1  # one run, dispatched once: the repeat was not announced
    assert len(await store.list_runs("default")) == 1


async def test_cancelling_a_running_run_stops_it_promptly(
    backend: Backend, clock: FakeClock
) -> None:
    store = backend.store
    slow = """
apiVersion: corral/v1
kind: Tool
metadata: {name: note}
spec:
  type: exec
  exec: {command: ["sleep", "30"]}
  parameters: {type: object}
  timeout_seconds: 60
"""
    await store.apply(
        load_text(
            "---".join([scripted("{tool_calls: [{name: note, arguments: {}}]}"), slow, agent()]),
            "t.yaml",
        )
    )
    run, _ = await backend.submit("helper", "go")
    async with backend.serving():
        with anyio.fail_after(10):
            while not any(e.type is EventType.TOOL_CALL for e in await store.list_events(run.id)):
                await anyio.sleep(0.05)
        started = time.monotonic()
        await store.request_cancel(run.id)
        clock.advance(30.0 / 3)  # the next lease renewal tells the run it is cancelled
        with anyio.fail_after(10):
            while (await get(store, run)).state is not RunState.CANCELLED:
                await anyio.sleep(0.05)
        assert time.monotonic() - started < 3
    events = await store.list_events(run.id)
    assert events[-1].type is EventType.RUN_FINISH and events[-1].data.state == "cancelled"


async def test_session_carries_the_conversation_across_runs(
    backend: Backend, fake_openai: FakeOpenAIServer
) -> None:
    store = backend.store
    fake_openai.add_reply(FakeReply(text="Hello Ada."), FakeReply(text="You are Ada."))
    await store.apply(
        load_text(
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec: {{provider: openai, model: m, base_url: "{fake_openai.base_url}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: friend}}
spec: {{model: fake}}
""",
            "t.yaml",
        )
    )
    await backend.submit("friend", "I am Ada.", session="s1")
    await backend.drain()
    await backend.submit("friend", "Who am I?", session="s1")
    await backend.drain()
    second = fake_openai.requests[1].json["messages"]
    assert [m["content"] for m in second] == ["I am Ada.", "Hello Ada.", "Who am I?"]
    stored = await store.session_messages("default", "s1")
    assert [m.message.content for m in stored] == [
        "I am Ada.",
        "Hello Ada.",
        "Who am I?",
        "You are Ada.",
    ]


# Approvals expire in the worker's upkeep, on its clock: with NATS too, this worker's
# upkeep comes every 0.1 s of that clock (on SQLite each drain begins with it).
@pytest.mark.worker(poll_seconds=0.1)
async def test_expired_approval_counts_as_rejected(
    backend: Backend, clock: FakeClock, tmp_path: Path
) -> None:
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: x}}]}", "{text: ok}"),
        NOTE_TOOL,
        agent(extra="  approval: {policy: always, expires_after_seconds: 60}"),
    )
    run, _ = await backend.submit("helper", "go")
    await backend.drain()
    [approval] = await store.list_approvals(run_id=run.id)
    assert approval.expires_at is not None and approval.expires_at > approval.requested_at
    clock.advance(approval.expires_at + 1 - clock.now())  # a second past its deadline
    with anyio.fail_after(10):  # a drain's worker expires it (NATS: the serving worker's upkeep)
        while (await store.list_approvals(run_id=run.id))[0].state is ApprovalState.PENDING:
            await backend.drain()
    await backend.drain()  # the worker resumes the run
    stored = await get(store, run)
    assert stored.state is RunState.SUCCEEDED and effects(tmp_path) == []
    [expired] = await store.list_approvals(run_id=run.id)
    assert expired.state is ApprovalState.EXPIRED
    [resolved] = [
        e.data.to_dict()
        for e in await store.list_events(run.id)
        if e.type is EventType.APPROVAL_RESOLVED
    ]
    assert (resolved["approved"], resolved["expired"], resolved.get("by")) == (False, True, None)
    assert resolved["decided_at"] == expired.decided_at
    tool_message = next(m for m in stored.messages if m.role == "tool")
    assert "expired" in tool_message.content


@pytest.mark.parametrize("compaction", ["summarize", "hide"])
async def test_a_compacted_session_still_answers_from_its_earlier_turns(
    backend: Backend, fake_openai: FakeOpenAIServer, compaction: str
) -> None:
    store = backend.store
    await store.apply(
        load_text(
            f"""
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {{name: fake}}
spec: {{provider: openai, model: m, base_url: "{fake_openai.base_url}"}}
---
apiVersion: corral/v1
kind: Agent
metadata: {{name: friend}}
spec:
  model: fake
  session: {{max_history_tokens: 100, compaction: {compaction}, keep_recent_messages: 2}}
""",
            "t.yaml",
        )
    )
    long_reply = "Noted. " + "I will remember that. " * 20  # pushes the history past 100 tokens
    fake_openai.add_reply(FakeReply(text=long_reply), FakeReply(text="It is sunny."))
    await backend.submit("friend", "My name is Ada and my cat is called Turing.", session="s")
    await backend.drain()
    await backend.submit("friend", "How is the weather?", session="s")
    await backend.drain()

    if compaction == "summarize":
        fake_openai.add_reply(FakeReply(text="The user is Ada; her cat is Turing."))
    fake_openai.add_reply(FakeReply(text="Your cat is Turing."))
    run, _ = await backend.submit("friend", "What is my cat called?", session="s")
    await backend.drain()

    assert (await get(store, run)).output == "Your cat is Turing."
    sent = [m["content"] for m in fake_openai.requests[-1].json["messages"]]
    assert sent[-1] == "What is my cat called?"
    assert "My name is Ada and my cat is called Turing." not in sent  # compacted away
    if compaction == "summarize":
        summary_request = fake_openai.requests[-2].json["messages"]
        assert "Turing" in summary_request[-1]["content"]  # the summarizer saw the old turns
        assert sent[0].startswith("[Summary of the earlier conversation]")
        assert "Turing" in sent[0]
    else:
        assert sent == ["How is the weather?", "It is sunny.", "What is my cat called?"]
    everything = await store.session_messages("default", "s", include_hidden=True)
    hidden = [m.message.content for m in everything if m.hidden]
    assert "My name is Ada and my cat is called Turing." in hidden  # kept for audit


@pytest.mark.worker(concurrency=1)
async def test_a_more_urgent_run_overtakes_a_backlog(backend: Backend, tmp_path: Path) -> None:
    # On NATS the backlog's deliveries come first in line: the claim puts the urgent run
    # ahead of them anyway.
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: x}}]}", "{text: ok}"),
        NOTE_TOOL,
        agent(),
    )
    backlog = [(await backend.submit("helper", f"job {n}"))[0] for n in range(4)]
    urgent, _ = await backend.submit("helper", "now", priority=5)
    await backend.drain()
    runs = [await get(store, run) for run in (*backlog, urgent)]
    assert all(r.state is RunState.SUCCEEDED and r.attempts == 1 for r in runs)
    order = [r.id for r in sorted(runs, key=lambda r: r.started_at or 0.0)]
    # Only what the worker took before the urgent run was submitted (the first of the
    # backlog, more on a loaded machine where runs finish faster than submits), and at
    # most one claim already under way then, starts before it.
    submitted_at = runs[-1].created_at
    taken = sum(1 for r in runs[:-1] if (r.started_at or 0.0) < submitted_at)
    assert order.index(urgent.id) <= max(taken, 1) + (1 if taken else 0), order
    assert order.index(urgent.id) < len(backlog), order  # it never waits for the whole backlog
    assert effects(tmp_path) == ["x"] * 5


async def test_a_run_whose_session_is_gone_fails_cleanly(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses to delete a session under an unfinished run; a session removed
    behind its back (or before that rule) fails the run with a clear error."""
    store = backend.store
    await apply(
        store,
        scripted("{tool_calls: [{name: note, arguments: {note: x}}]}", "{text: ok}"),
        NOTE_TOOL,
        agent(extra="  approval: {policy: always}"),
    )
    run, _ = await backend.submit("helper", "go", session="s-gone")
    await backend.drain()
    [approval] = await store.list_approvals(run_id=run.id)
    await on_database(
        backend.deployment.db_url,
        lambda conn: conn.execute(sa.text("DELETE FROM sessions WHERE id = 's-gone'")),
    )
    await backend.decide(approval.id, True)
    caplog.clear()
    await backend.drain()
    stored = await get(store, run)
    # the resume after the approval is the first attempt since the pause (attempts restart)
    assert (stored.state, stored.attempts) == (RunState.FAILED, 1)
    assert stored.error is not None and stored.error["code"] == "not_found"
    assert "session 's-gone' of namespace 'default' no longer exists" in stored.error["message"]
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []  # no traceback


async def test_a_store_error_while_the_agent_is_built_is_the_workers_not_the_runs(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent cache reads the namespace's resources fingerprint before every run: a store
    # that fails then (a PostgreSQL restart) must leave the run to be claimed again, not
    # fail it as if its Agent could not be built.
    await apply(store, scripted("{text: done}"), NOTE_TOOL, agent())
    run = RunRecord(id=new_id("run"), namespace="default", agent="helper", input="hi")
    await store.submit_run(run)

    async def down(namespace: str) -> tuple[int, int, float]:
        raise StoreError("cannot read the resources: the database is restarting")

    async with RunExecutor(store, settings) as executor:
        [(record, lease)] = await store.claim_runs("w1", 30.0, run_ids=[run.id])
        with monkeypatch.context() as patched:
            patched.setattr(store, "resources_fingerprint", down)
            with pytest.raises(StoreError):
                await executor.execute(record, lease)
        stored = await get(store, run)
        assert (stored.state, stored.error) == (RunState.RUNNING, None)
        assert await store.list_events(run.id) == []
        # the lease runs out; the next claim runs it to the end
        [(record, lease)] = await store.claim_runs(
            "w2", 30.0, run_ids=[run.id], now=time.time() + 60
        )
        assert await executor.execute(record, lease) == "done"
    assert (await get(store, run)).state is RunState.SUCCEEDED
