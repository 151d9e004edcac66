"""Each agent as an A2A server (the Agent2Agent protocol, spec 1.0, with 0.3 compatibility).

    GET  /a2a/{namespace}/{agent}/.well-known/agent-card.json   the agent card (viewer; anyone
                                                                 with CORRAL_A2A_PUBLIC_CARDS)
    POST /a2a/{namespace}/{agent}                                JSON-RPC 2.0
    POST /a2a/{namespace}/{agent}/message:send, ...              HTTP+JSON (REST)

The agent's base URL is ``/a2a/{namespace}/{agent}``: the SDK's client resolves the
card at ``<base>/.well-known/agent-card.json`` and the card names the base as both its
JSON-RPC interface (1.0 and 0.3) and its HTTP+JSON one (1.0: ``message:send``,
``message:stream``, ``tasks/{id}``, ``tasks/{id}:cancel``, ``tasks/{id}:subscribe``,
``tasks``, the push notification configs and ``extendedAgentCard`` under it, the SDK's
REST dispatcher over the same request handler). Methods: ``SendMessage`` and
``SendStreamingMessage`` (0.3: ``message/send``, ``message/stream``) need the operator role, ``CancelTask``
(``tasks/cancel``) too; ``GetTask`` (``tasks/get``), ``ListTasks`` (1.0 only: 0.3 has
no such method) and ``SubscribeToTask`` (``tasks/resubscribe``) the viewer role. Push
notifications are not offered (their A2A error); the extended card only with public
cards (``CORRAL_A2A_PUBLIC_CARDS``): then the card is served to a request without a
token, and the full card to a viewer as the authenticated extended card.

Authentication is the API's (:func:`corral.server.auth.require`): a bearer token,
401/403/429 as ``application/problem+json`` before any JSON-RPC is read. A namespace
other than the token's, or an agent that does not exist, is 404 ``not_found``, as
everywhere. What the JSON-RPC layer refuses (malformed JSON, an unknown method, bad
params, a file part) is a JSON-RPC error with HTTP 200, rendered by the SDK.

The routes are left out of ``/openapi.json``: their contract is the agent card and
the A2A specification, not an OpenAPI operation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import InvalidParamsError, JSONParseError
from a2a.server.request_handlers.response_helpers import (
    agent_card_to_dict,
    build_error_response,
)
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.routes.rest_dispatcher import RestDispatcher
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import InvalidParamsError as A2AInvalidParamsError
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from corral import __version__
from corral.core.tokens import Role
from corral.resources.kinds import NAME_PATTERN
from corral.server.a2a_tasks import CALLER, REQUEST, Caller, CorralRequestHandler, shown
from corral.server.auth import Principal, Viewer, require
from corral.server.context import ServerContext, context_of
from corral.server.problems import ProblemError

router = APIRouter(prefix="/a2a", include_in_schema=False)

Namespace = Annotated[str, Path(pattern=NAME_PATTERN, max_length=63)]
AgentName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=253)]

#: the JSON-RPC methods (1.0 and 0.3 names) that start or stop runs: operator role
OPERATOR_METHODS = frozenset(
    {
        "SendMessage",
        "SendStreamingMessage",
        "CancelTask",
        "message/send",
        "message/stream",
        "tasks/cancel",
    }
)
BEARER = "bearer"
#: the card's optional bearer token (``require`` judges it when one is sent)
_optional_bearer = HTTPBearer(auto_error=False)


#: what the SDK's dispatcher logs, with a traceback, when a client sends a malformed request
CLIENT_FAULTS = frozenset(
    {"Failed to validate base JSON-RPC request", "Failed to parse request params"}
)


class _ClientFaultsWithoutTraceback(logging.Filter):
    """A malformed request is the client's fault: one warning line, not a traceback at
    ERROR level that any caller could make the server write (log flooding)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in CLIENT_FAULTS:
            error = record.exc_info[1] if record.exc_info else None
            record.msg = f"{record.msg} (a malformed A2A request): {type(error).__name__}"
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_SDK_DISPATCHER_LOG = logging.getLogger(JsonRpcDispatcher.__module__)
if not any(isinstance(f, _ClientFaultsWithoutTraceback) for f in _SDK_DISPATCHER_LOG.filters):
    _SDK_DISPATCHER_LOG.addFilter(_ClientFaultsWithoutTraceback())


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, with the caller the route established."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[CALLER] = request.state.a2a_caller
        context.state[REQUEST] = request
        return context


def _rest_dispatcher(request: Request) -> RestDispatcher:
    """The app's one HTTP+JSON dispatcher (made on first use) over its one request handler."""
    dispatcher = getattr(request.app.state, "a2a_rest_dispatcher", None)
    if not isinstance(dispatcher, RestDispatcher):
        dispatcher = RestDispatcher(
            _handler(context_of(request)), context_builder=_ContextBuilder()
        )
        request.app.state.a2a_rest_dispatcher = dispatcher
    return dispatcher


def _handler(context: ServerContext) -> CorralRequestHandler:
    def extended_card(caller: Caller) -> AgentCard:
        return agent_card(base_url(context, caller.namespace, caller.agent), caller, extended=True)

    return CorralRequestHandler(context, extended_card)


def _dispatcher(request: Request) -> JsonRpcDispatcher:
    """The app's one dispatcher (made on first use) over its one request handler."""
    dispatcher = getattr(request.app.state, "a2a_dispatcher", None)
    if not isinstance(dispatcher, JsonRpcDispatcher):
        dispatcher = JsonRpcDispatcher(
            _handler(context_of(request)),
            context_builder=_ContextBuilder(),
            enable_v0_3_compat=True,
        )
        request.app.state.a2a_dispatcher = dispatcher
    return dispatcher


async def _caller(context: ServerContext, who: Principal, namespace: str, agent: str) -> Caller:
    """The agent of the URL, when it is in the token's namespace and exists; else 404."""
    if namespace != who.namespace or (
        await context.store.get_resource(namespace, "Agent", agent) is None
    ):
        raise ProblemError(404, f"agent {agent!r} not found", code="not_found")
    return Caller(namespace, agent)


def base_url(context: ServerContext, namespace: str, agent: str) -> str:
    """The agent's A2A URL, under the server's own URL: ``CORRAL_PUBLIC_URL``, else the
    address ``corral serve`` listens on.

    Never the request's ``Host`` header: any client may send any Host, and a card naming
    that client's choice would send the next caller (or a cache's) to the attacker's URL.
    An app served by something other than ``corral serve`` without ``CORRAL_PUBLIC_URL``
    does not know its URL: the card is refused rather than guessed.
    """
    if context.public_url is None:
        raise ProblemError(
            503,
            "the server does not know its public URL for the agent card: set CORRAL_PUBLIC_URL",
            code="public_url_unset",
        )
    return f"{context.public_url}/a2a/{namespace}/{agent}"


def agent_card(url: str, caller: Caller, *, extended: bool = False) -> AgentCard:
    """The card of one agent: its JSON-RPC interface, streaming, bearer auth, one skill;
    with ``extended``, it says the authenticated extended card is offered."""
    return AgentCard(
        name=caller.agent,
        description=f"The Corral agent {caller.agent!r} of namespace {caller.namespace!r}.",
        version=__version__,
        provider=AgentProvider(organization="Corral", url=url.split("/a2a/", 1)[0]),
        # one endpoint serves both versions (the dispatcher's 0.3 compatibility)
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding=TransportProtocol.JSONRPC.value, protocol_version=version
            )
            for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        ]
        + [
            AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.HTTP_JSON.value,
                protocol_version=PROTOCOL_VERSION_1_0,
            )
        ],
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=False, extended_agent_card=extended
        ),
        security_schemes={
            BEARER: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="corral_<id>_<secret>",
                    description="A Corral API token of the agent's namespace (operator to send).",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={BEARER: StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id=caller.agent,
                name=caller.agent,
                description=f"Run the Corral agent {caller.agent!r} on a text message.",
                tags=["corral"],
            )
        ],
    )


@router.get("/{namespace}/{agent}/.well-known/agent-card.json")
async def get_agent_card(
    namespace: Namespace,
    agent: AgentName,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_optional_bearer)],
) -> JSONResponse:
    """The agent card of one agent (A2A discovery): a viewer's, or with
    ``CORRAL_A2A_PUBLIC_CARDS`` anyone's when the request has no ``Authorization``."""
    context = context_of(request)
    public = context.settings.a2a_public_cards
    if public and request.headers.get("authorization") is None:
        if await context.store.get_resource(namespace, "Agent", agent) is None:
            raise ProblemError(404, f"agent {agent!r} not found", code="not_found")
        caller = Caller(namespace, agent)
    else:
        who = await require(Role.VIEWER)(request, credentials)
        caller = await _caller(context, who, namespace, agent)
    card = agent_card(base_url(context, namespace, agent), caller, extended=public)
    return JSONResponse(agent_card_to_dict(card))


@router.post("/{namespace}/{agent}")
async def a2a_jsonrpc(
    namespace: Namespace, agent: AgentName, who: Viewer, request: Request
) -> Response:
    """The agent's A2A JSON-RPC endpoint (see the module docstring)."""
    context = context_of(request)
    caller = await _caller(context, who, namespace, agent)
    try:
        document = _document(await request.body())
    except RecursionError:  # the SDK would answer an internal error
        error = JSONParseError(message="the JSON nests too deeply")
        return JSONResponse(build_error_response(None, error))
    method = document.get("method") if document is not None else None
    if not isinstance(method, str):  # the SDK judges it
        method = None
    elif method == "ListTasks" and document and (bad := _unknown_status(document)):
        refused = InvalidParamsError(message=f"status {bad} is not a task state")
        return JSONResponse(build_error_response(_request_id(document), refused))
    if method in OPERATOR_METHODS:
        _needs_operator(who, method)
    request.state.a2a_caller = caller
    return await _dispatcher(request).handle_requests(request)


def _needs_operator(who: Principal, what: str) -> None:
    if not who.role.allows(Role.OPERATOR):
        raise ProblemError(
            403, f"{what} needs the operator role; the token has {who.role.value}", code="forbidden"
        )


#: the HTTP+JSON binding: (path under the agent's base, method, the SDK dispatcher's
#: method, whether it needs the operator role); a ``:verb`` path before the plain one
REST_ROUTES = (
    ("/message:send", "POST", "on_message_send", True),
    ("/message:stream", "POST", "on_message_send_stream", True),
    ("/tasks/{id}:cancel", "POST", "on_cancel_task", True),
    ("/tasks/{id}:subscribe", "GET", "on_subscribe_to_task", False),
    ("/tasks/{id}:subscribe", "POST", "on_subscribe_to_task", False),
    ("/tasks/{id}", "GET", "on_get_task", False),
    ("/tasks", "GET", "list_tasks", False),
    ("/tasks/{id}/pushNotificationConfigs/{push_id}", "GET", "get_push_notification", False),
    ("/tasks/{id}/pushNotificationConfigs/{push_id}", "DELETE", "delete_push_notification", True),
    ("/tasks/{id}/pushNotificationConfigs", "POST", "set_push_notification", True),
    ("/tasks/{id}/pushNotificationConfigs", "GET", "list_push_notifications", False),
    ("/extendedAgentCard", "GET", "handle_authenticated_agent_card", False),
)


def _rest_endpoint(
    method: str, operation: str, operator: bool
) -> Callable[..., Awaitable[Response]]:
    async def endpoint(
        namespace: Namespace, agent: AgentName, who: Viewer, request: Request
    ) -> Response:
        context = context_of(request)
        caller = await _caller(context, who, namespace, agent)
        if operator:
            _needs_operator(who, f"{method} {request.url.path}")
        if operation == "list_tasks":  # (as over JSON-RPC: see _unknown_status)
            for status in request.query_params.getlist("status"):
                if (bad := _unknown_state(status)) is not None:
                    refused = A2AInvalidParamsError(f"status {bad} is not a task state")
                    return JSONResponse(build_rest_error_payload(refused), status_code=400)
        request.state.a2a_caller = caller
        handle: Callable[[Request], Awaitable[Response]] = getattr(
            _rest_dispatcher(request), operation
        )
        return await handle(request)

    endpoint.__name__ = f"a2a_rest_{operation}_{method.lower()}"
    return endpoint


for _path, _verb, _operation, _operator in REST_ROUTES:
    router.add_api_route(
        f"/{{namespace}}/{{agent}}{_path}",
        _rest_endpoint(_verb, _operation, _operator),
        methods=[_verb],
    )


def _document(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC request object of a body, when it is one (the SDK judges the rest)."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _unknown_status(document: dict[str, Any]) -> str | None:
    """A JSON-RPC ListTasks ``status`` that names no task state, quoted (see
    :func:`_unknown_state`)."""
    params = document.get("params")
    status = params.get("status") if isinstance(params, dict) else None
    return _unknown_state(status) if isinstance(status, str) else None


def _unknown_state(name: str) -> str | None:
    """``name``, quoted, when it names no task state. The SDK parses params ignoring what
    it does not know, unknown enum names too: a ListTasks ``status`` filter would vanish
    and the listing come back unfiltered instead of refused."""
    try:
        TaskState.Value(name)
    except ValueError:
        return shown(name)
    return None


def _request_id(document: dict[str, Any]) -> str | int | None:
    request_id = document.get("id")
    valid = isinstance(request_id, str | int) and not isinstance(request_id, bool)
    return request_id if valid else None
