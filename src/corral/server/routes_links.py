"""Linked agents for tool programs: ``/v1/links``, authenticated by an agent token only.

A run of an agent with ``links`` plants ``CORRAL_AGENT_TOKEN`` (and ``CORRAL_URL``)
in the environment of its ``exec`` tools (:mod:`corral.runtime.agent_tokens`). With
it a tool program may list the calling agent's linked agents, describe one, and
run one as a **child run of the calling run**: the caller (namespace, agent, run)
is the token's, never the body's. These routes accept nothing else: an API token
is 403 ``agent_token_required`` (every other route refuses an agent token with 403
``agent_token_not_allowed``); an expired token is 401 ``token_expired``, a
malformed or tampered one 401 ``token_invalid``. An agent that is not in the
token's links, or no longer in the calling agent's, is 404 as if it did not exist; one
its roles deny (``agent:NAME`` in a ToolPermission, as for ``agents_exec``) is 403
``permission_denied``, and ``GET /v1/links`` leaves it out. A ``session`` is continued
only when the calling run's tree opened it, or it is the session of the calling run or
an ancestor: another is 403 ``session_not_allowed`` (the store decides, in the submit's
transaction: see ``check_session_of_tree``).

The child is started by :meth:`StoreDelegation.start_child_of`, what ``agents_exec``
uses; its idempotency key is the caller's run and the request's ``Idempotency-Key``
header (a retried request finds the child it started; without the header each
request starts a child). The calling run must be ``running`` (409 ``conflict``
otherwise: a token that outlived its tool call starts nothing under a parked or
finished run). ``wait`` (default true) answers 200 with the child's
task once it settles, or 202 when ``timeout_seconds`` passes first.

The calling run does not park: its tool call holds this request, so the run stays
``running`` (its worker slot and lease kept, the tool's timeout bounding the wait). The
child's spend is charged to it like an ``agents_exec`` child's: the loop journals a
``child.finish`` (no ``call_id``) once the calls of the step that started it are done
(see ``_LinkedCalls`` in :mod:`corral.runtime.executor`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from corral.api import LinkExec, LinkInfo, LinkOut, LinkPage, Task
from corral.core.errors import ToolError, ToolErrorCode
from corral.core.ids import new_id
from corral.core.redaction import Redactor
from corral.core.runs import RunState
from corral.resources.kinds import NAME_PATTERN, AgentLink, AgentSpec
from corral.runtime.agent_tokens import (
    REDACTION_NAME,
    AgentClaims,
    AgentTokenError,
    looks_like_agent_token,
)
from corral.runtime.builder import AgentBuilder
from corral.runtime.delegation import (
    StoreDelegation,
    link_allowance,
    link_child_key,
    token_call_ended,
)
from corral.runtime.follow import Until
from corral.server.context import ServerContext, context_of
from corral.server.limits import address_key, refuse_while_waiting
from corral.server.problems import ProblemError, responses
from corral.server.verifier import unauthenticated
from corral.tools.agents import AGENT_PREFIX
from corral.tools.governance import Permissions

router = APIRouter(prefix="/v1", tags=["links"])

_agent_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="JWT",
    description="The agent token a run plants in its tools' environment (CORRAL_AGENT_TOKEN).",
    scheme_name="AgentToken",
)

LinkedName = Annotated[str, Path(pattern=NAME_PATTERN, description="The linked agent.")]


async def agent_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_agent_bearer)],
) -> AgentClaims:
    """The calling run, from its agent token (see the module docstring for the answers)."""
    context = context_of(request)
    if credentials is None or credentials.scheme.lower() != "bearer":
        # (no token guesses nothing: neither counted nor held back, as on other routes)
        raise unauthenticated("send Authorization: Bearer <agent token>")
    address = address_key(request.client.host if request.client else None)
    refuse_while_waiting(
        context.auth_failures.wait(address), "failed authentications from this address"
    )
    if not looks_like_agent_token(credentials.credentials):
        raise ProblemError(
            403,
            "/v1/links takes the agent token of a run (CORRAL_AGENT_TOKEN), not an API token",
            code="agent_token_required",
        )
    try:
        claims = context.agent_tokens.verify(credentials.credentials)
    except AgentTokenError as exc:
        context.auth_failures.acquire(address)
        problem = unauthenticated(exc.message)
        problem.code = exc.code
        raise problem from None
    refuse_while_waiting(context.limiter.acquire(f"run:{claims.run_id}"), "requests for this run")
    return claims


Caller = Annotated[AgentClaims, Depends(agent_caller)]


async def _links(context: ServerContext, caller: AgentClaims) -> tuple[AgentSpec, list[AgentLink]]:
    """The caller's links that both its token and its Agent (as stored now) name."""
    stored = await context.store.get_resource(caller.namespace, "Agent", caller.agent)
    spec = stored.resource.spec if stored is not None else None
    if not isinstance(spec, AgentSpec):
        raise ProblemError(404, f"agent {caller.agent!r} no longer exists", code="not_found")
    allowed = set(caller.links)
    return spec, [link for link in spec.links if link.agent in allowed]


async def _permissions(context: ServerContext, caller: AgentClaims, spec: AgentSpec) -> Permissions:
    """What the calling agent's roles allow: ``agent:NAME`` is checked as ``agents_exec``
    and ``agents_info`` check it (the links alone without roles)."""
    builder = AgentBuilder(context.store, context.settings, caller.namespace)
    return await builder.permissions(spec)


async def _link(
    context: ServerContext, caller: AgentClaims, name: str
) -> tuple[AgentSpec, AgentLink]:
    """The linked agent ``name``: 404 when not linked, 403 when the roles deny it."""
    spec, links = await _links(context, caller)
    for link in links:
        if link.agent == name:
            permissions = await _permissions(context, caller, spec)
            try:
                permissions.check(f"{AGENT_PREFIX}{name}")
            except ToolError as exc:
                raise ProblemError(403, exc.info.reason, code="permission_denied") from None
            return spec, link
    # as for an object of another namespace: nothing is said of agents it may not call
    raise ProblemError(404, f"no linked agent {name!r}", code="not_found")


@router.get(
    "/links",
    response_model=LinkPage,
    summary="The calling agent's linked agents",
    responses=responses(404),
)
async def list_links(caller: Caller, request: Request) -> LinkPage:
    """The agents the token's agent may call (its `links`)."""
    context = context_of(request)
    spec, links = await _links(context, caller)
    allows = (await _permissions(context, caller, spec)).allows
    return LinkPage(
        items=[
            LinkOut(agent=x.agent, description=x.description)
            for x in links
            if allows(f"{AGENT_PREFIX}{x.agent}")
        ]
    )


@router.get(
    "/links/{agent}",
    response_model=LinkInfo,
    summary="Describe a linked agent",
    responses=responses(404),
)
async def get_link(agent: LinkedName, caller: Caller, request: Request) -> LinkInfo:
    """Its description, tools and output schema."""
    context = context_of(request)
    _, link = await _link(context, caller, agent)
    try:
        info = await StoreDelegation(context.store).describe(caller.namespace, agent)
    except ToolError:
        raise ProblemError(404, f"no linked agent {agent!r}", code="not_found") from None
    return LinkInfo.of(agent, link.description, info)


_EXEC_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Task, "description": "The child run settled (see `state`, `output`)."},
    202: {
        "model": Task,
        "description": "The child goes on (`wait: false`, or the timeout passed first).",
    },
    **responses(404, 409, 422),
}


@router.post(
    "/links/{agent}/exec",
    response_model=Task,
    summary="Run a linked agent as a child of the calling run",
    responses=_EXEC_RESPONSES,
)
async def exec_link(
    agent: LinkedName,
    body: LinkExec,
    caller: Caller,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Task:
    """A child run of the token's run (`parent_run_id`), like the `agents_exec` tool."""
    context = context_of(request)
    spec, _ = await _link(context, caller, agent)
    parent = await context.store.get_run(caller.run_id)
    if parent is None or parent.namespace != caller.namespace:
        raise ProblemError(404, f"the calling run {caller.run_id} is gone", code="not_found")
    if parent.state is not RunState.RUNNING:
        # only a running run's tool programs hold its token: one that outlived its call
        # starts nothing under a parked or finished run
        raise ProblemError(
            409,
            f"the calling run {caller.run_id} is {parent.state.value}, not running",
            code="conflict",
        )
    if await token_call_ended(context.store, caller):
        raise ProblemError(
            401,
            "the tool call this agent token was minted for has ended: a call's token starts "
            "children only while its call runs",
            code="token_expired",
        )
    # the caller's own token never goes into the child's input: a run's input and events
    # are any viewer's to read, and the token starts runs while its run runs
    user_input = _without_token(body.input, request)
    # the request's key and what it asks, digested (any header length makes a short key);
    # without a key each request is a call of its own
    asked = {"agent": agent, "input": user_input, "session": body.session}
    digest = hashlib.sha256(
        json.dumps([idempotency_key or new_id("x"), asked], ensure_ascii=False).encode()
    ).hexdigest()[:32]
    key = link_child_key(caller.run_id, caller.call, digest)
    delegation = StoreDelegation(context.store, context.bus)
    try:
        child = await delegation.start_child_of(
            caller.run_id,
            caller.namespace,
            agent,
            user_input,
            body.session,
            key=key,
            max_depth=spec.limits.max_depth,
            # what the calling run had left for the call when it started (the token says)
            allowance=link_allowance(caller),
        )
    except ToolError as exc:
        raise _problem(exc) from None
    record = await context.store.get_run(child.run_id)
    assert record is not None  # just submitted (a purge would take days)
    if body.wait:
        timeout = min(body.timeout_seconds, context.max_prompt_timeout_seconds)
        record = await context.settle(child.run_id, timeout, request) or record
    response.status_code = 200 if Until.SETTLED.reached(record.state) else 202
    response.headers["Location"] = f"/v1/tasks/{record.id}"
    return Task.from_record(record)


def _without_token(text: str, request: Request) -> str:
    """``text`` with the request's agent token redacted in every form redaction knows
    (escaped, base64, hex...), as its tool's output has it."""
    _, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return Redactor({REDACTION_NAME: token}).text(text) if token else text


def _problem(exc: ToolError) -> ProblemError:
    code = exc.info.code
    if code == ToolErrorCode.UNAVAILABLE:
        return ProblemError(404, exc.info.reason, code="not_found")
    if code == ToolErrorCode.BUDGET_EXCEEDED:
        return ProblemError(409, exc.info.reason, code="budget_exceeded")
    if code == ToolErrorCode.PERMISSION_DENIED:  # a session of another run tree
        refused = str(exc.info.details.get("refused", "permission_denied"))
        return ProblemError(403, exc.info.reason, code=refused)
    return ProblemError(422, exc.info.reason, code="invalid_request")
