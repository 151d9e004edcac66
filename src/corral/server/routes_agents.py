"""Prompting an agent over HTTP: submit a run and wait for its answer, up to a timeout."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from corral.api import Prompt, PromptObject, Task
from corral.resources.kinds import NAME_PATTERN, AgentSpec
from corral.runtime import operations
from corral.runtime.follow import Until
from corral.server.auth import Operator, Principal
from corral.server.context import context_of
from corral.server.problems import FieldProblem, ProblemError, responses
from corral.server.routes_tasks import check_schema

router = APIRouter(prefix="/v1", tags=["agents"])

AgentName = Annotated[str, Path(pattern=NAME_PATTERN, description="The agent.")]

_PROMPT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": Task,
        "description": "The run settled: it finished (see `state`, `output`, `error`) or "
        "waits for approval.",
    },
    202: {
        "model": Task,
        "description": "The timeout passed first (or the server is shutting down): the task "
        "goes on; follow it at /v1/runs/{id}/events.",
    },
    **responses(404, 409),
}


@router.post(
    "/agents/{name}/prompt",
    response_model=Task,
    summary="Prompt an agent and wait for the answer",
    responses=_PROMPT_RESPONSES,
)
async def prompt(
    name: AgentName, body: Prompt, who: Operator, request: Request, response: Response
) -> Task:
    """Queue a run of the agent and wait until it finishes or waits for approval."""
    return await _ask(request, who, name, body, None, response)


@router.post(
    "/agents/{name}/prompt-object",
    response_model=Task,
    summary="Prompt an agent for JSON that matches a schema",
    responses=_PROMPT_RESPONSES,
)
async def prompt_object(
    name: AgentName, body: PromptObject, who: Operator, request: Request, response: Response
) -> Task:
    """Like prompt, with the answer (`output`) parsed and validated against `schema`
    (or the agent's own `output_schema`); the model is asked to repair an invalid answer
    up to the agent's `output_retries`, then the run fails with `invalid_output`."""
    context = context_of(request)
    check_schema(body.schema_, "body.schema")
    if body.schema_ is None:
        stored = await context.store.get_resource(who.namespace, "Agent", name)
        spec = stored.resource.spec if stored is not None else None
        if isinstance(spec, AgentSpec) and spec.output_schema is None:
            raise ProblemError(
                422,
                f"agent {name!r} has no output_schema: send one",
                code="invalid_request",
                errors=[FieldProblem(field="body.schema", reason="required for this agent")],
            )
    return await _ask(request, who, name, body, body.schema_, response)


async def _ask(
    request: Request,
    who: Principal,
    agent: str,
    body: Prompt,
    schema: dict[str, Any] | None,
    response: Response,
) -> Task:
    context = context_of(request)
    record, _ = await operations.submit(
        context.store,
        agent,
        body.input,
        namespace=who.namespace,
        session=body.session,
        output_schema=schema,
        bus=context.bus,
    )
    timeout = min(body.timeout_seconds, context.max_prompt_timeout_seconds)
    final = await context.settle(record.id, timeout, request) or record
    settled = Until.SETTLED.reached(final.state)
    response.status_code = 200 if settled else 202
    response.headers["Location"] = f"/v1/tasks/{record.id}"
    return Task.from_record(final)
