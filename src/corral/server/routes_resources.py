"""Resources: apply (YAML or JSON), list, get, delete - in the token's namespace only.

An apply is all or nothing, as with ``corral apply``. A document without
``metadata.namespace`` goes to the token's namespace; one naming another
namespace is refused (422 at ``metadata.namespace``). Relative program and module
paths (``./tool.py``) have no file to be relative to over HTTP: they are refused
(422 naming the field); ``corral apply -f`` makes them absolute before sending.

Applying resources is code execution on the server (``exec`` and ``python``
tools, MCP server commands): that is why it takes the admin role.

A ``NamespacePolicy`` bounds what a namespace's admins may run, so only an admin
of the ``default`` namespace (the operator) may apply or delete one (403
otherwise); such an admin may apply one for any namespace.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import TypeAdapter

from corral.api import (
    KIND_NAMES,
    AppliedResource,
    ApplyResult,
    ResourceDeletion,
    ResourceDocument,
    ResourceOut,
    ResourcePage,
    resource_out,
    surrogate_path,
)
from corral.core.errors import DocumentTooComplexError, NotFoundError, ResourceError
from corral.core.limits import DocumentLimits
from corral.core.selectors import (
    MAX_SELECTOR_CHARS,
    InvalidSelectorError,
    Selector,
    parse_selector,
)
from corral.resources.execution import NAMESPACE_POLICY_KIND
from corral.resources.kinds import KINDS, NAME_PATTERN, kind_of
from corral.resources.loader import LoadedResource, load_text, unanchored_paths
from corral.resources.secrets import redacted
from corral.server import pagination
from corral.server.auth import Admin, Principal, Viewer
from corral.server.context import context_of
from corral.server.problems import (
    FieldProblem,
    ProblemError,
    resource_problems,
    responses,
    too_complex,
)
from corral.store.base import StoredResource

router = APIRouter(prefix="/v1", tags=["resources"])

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPE = "application/json"

#: the namespace whose admins are the operator's: they set NamespacePolicies
OPERATOR_NAMESPACE = "default"
_KIND_DOC = f"One of {', '.join(KINDS)}, also in lower case and plural (`agent`, `agents`)."
_KIND_ENUM = {"enum": list(KIND_NAMES)}
KindParam = Annotated[str, Path(description=_KIND_DOC, json_schema_extra=_KIND_ENUM)]
NameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="The resource's name.")]

#: Where the schemas of the documents an apply takes are published (see ``app._openapi``).
_REF = "#/components/schemas/{model}"
_DOCUMENTS = TypeAdapter(ResourceDocument | list[ResourceDocument]).json_schema(ref_template=_REF)
#: The component schemas the apply body refers to: a document of each kind, its spec.
DOCUMENT_COMPONENTS: dict[str, Any] = _DOCUMENTS.pop("$defs")

_APPLY_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "Resource documents: multi-document YAML, or JSON (one document or a "
        "list of them). Each document's `spec` has the schema of its `kind`.",
        "content": {
            "application/yaml": {"schema": {"type": "string"}},
            JSON_TYPE: {"schema": _DOCUMENTS},
        },
    }
}


def _kind(text: str, where: str) -> str:
    """The canonical kind of ``text``, one of :data:`KIND_NAMES` (422 otherwise)."""
    if text not in KIND_NAMES:
        reason = f"unknown kind {text!r}; kinds are {', '.join(KINDS)}"
        raise ProblemError(
            422,
            reason,
            code="invalid_request",
            errors=[FieldProblem(field=where, reason=reason)],
        )
    return kind_of(text)


def _selector(text: str) -> Selector:
    """The label selector of ``?selector=`` (422 naming it when malformed)."""
    try:
        return parse_selector(text)
    except InvalidSelectorError as exc:
        raise ProblemError(
            422,
            exc.message,
            code="invalid_request",
            errors=[FieldProblem(field="query.selector", reason=exc.message)],
        ) from None


def _out(stored: StoredResource) -> ResourceOut:
    return resource_out(stored, redacted(stored.resource.to_document()))


@router.post(
    "/resources",
    response_model=ApplyResult,
    summary="Apply resources",
    openapi_extra=_APPLY_BODY,
    responses=responses(409, 415),
)
async def apply_resources(
    who: Admin,
    request: Request,
    dry_run: Annotated[
        bool,
        Query(description="Check the documents and say what applying would do; store nothing."),
    ] = False,
) -> ApplyResult:
    """Create or update every document of the body, all or nothing (like `corral apply`);
    with `dry_run` the outcomes say what would happen (`created`, `configured`,
    `unchanged`) and nothing is stored."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProblemError(400, "the body is not UTF-8 text", code="bad_request") from None
    limits = context_of(request).settings.document_limits
    if media in YAML_TYPES:
        loaded = await _load(text, who, limits, json_documents=False)
    elif media == JSON_TYPE or media.endswith("+json"):
        # (parsing a large body is CPU work: off the event loop, as YAML's is)
        as_yaml = await anyio.to_thread.run_sync(_json_as_yaml, text, limits)
        loaded = await _load(as_yaml, who, limits, json_documents=True)
    else:
        raise ProblemError(
            415,
            f"send {JSON_TYPE} or application/yaml, not {media or 'no content type'}",
            code="unsupported_media_type",
        )
    if not loaded:
        raise ProblemError(
            422,
            "no resource documents in the body",
            code="invalid_resource",
            errors=[FieldProblem(field="body", reason="no documents")],
        )
    try:
        outcomes = await context_of(request).store.apply(loaded, dry_run=dry_run)
    except ResourceError as exc:  # references: as _load's problems, by document for JSON
        problems = resource_problems(exc)
        if media not in YAML_TYPES:
            problems = [_json_problem(p) for p in problems]
        raise _invalid(problems) from None
    return ApplyResult(outcomes=[AppliedResource.from_outcome(o) for o in outcomes])


def _json_as_yaml(text: str, limits: DocumentLimits) -> str:
    """JSON documents as YAML text with document ``i`` on line ``2 i + 1`` (see ``_load``)."""
    try:
        value = limits.loads_json(text)
    except DocumentTooComplexError as exc:
        raise too_complex(exc) from None
    except ValueError as exc:
        raise ProblemError(400, f"invalid JSON: {exc}", code="invalid_json") from None
    documents = value if isinstance(value, list) else [value]
    for index, document in enumerate(documents):
        where = surrogate_path(document)
        if where is not None:
            raise _not_unicode(where, document=index)
    # JSON is YAML (flow style); one document per line keeps its index recoverable.
    return "\n---\n".join(_as_yaml_line(doc) for doc in documents)


# A character beyond the BMP as JSON escapes it: a surrogate pair (after an even number
# of backslashes, so that an escaped backslash followed by "u" is left alone).
_SURROGATE_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})")


def _as_yaml_line(document: Any) -> str:
    """``document`` as one line of YAML (JSON, its escapes kept for YAML's reader, which
    refuses some characters raw) - but a character beyond the BMP is written as itself:
    YAML reads the two halves of a ``\\ud83d\\udc4b`` escape as two lone surrogates."""

    def joined(match: re.Match[str]) -> str:
        high, low = int(match.group(2), 16), int(match.group(3), 16)
        return match.group(1) + chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))

    return _SURROGATE_PAIR.sub(joined, json.dumps(document))


async def _load(
    text: str, who: Principal, limits: DocumentLimits, *, json_documents: bool
) -> list[LoadedResource]:
    try:
        # YAML parsing of a large body is CPU work: off the event loop.
        loaded = await anyio.to_thread.run_sync(
            lambda: load_text(text, None, default_namespace=who.namespace, limits=limits)
        )
        _may_apply_policies(who, loaded)
        for item in loaded:  # YAML escapes ("\\ud800") can make them too
            where = surrogate_path(item.resource.to_document())
            if where is not None:
                raise _not_unicode(where, line=item.line)
        foreign = [
            (
                item.location(("metadata", "namespace")),
                f"this token applies to namespace {who.namespace!r} only",
            )
            for item in loaded
            if item.resource.namespace != who.namespace and not _operator_policy(who, item)
        ]
        refused = foreign + unanchored_paths(loaded)
        if refused:
            raise ResourceError(refused)
    except DocumentTooComplexError as exc:
        line = exc.location.line
        if json_documents and line is not None:
            raise too_complex(exc, document=(line - 1) // 2) from None
        raise too_complex(exc) from None
    except ResourceError as exc:
        problems = resource_problems(exc)
        if json_documents:
            problems = [_json_problem(p) for p in problems]
        raise _invalid(problems) from None
    return loaded


def _forbidden_policy() -> ProblemError:
    return ProblemError(
        403,
        f"a {NAMESPACE_POLICY_KIND} bounds what a namespace's admins may run: only an admin "
        f"of namespace {OPERATOR_NAMESPACE!r} (or the store's owner) may apply or delete one",
        code="forbidden",
    )


def _operator_policy(who: Principal, item: LoadedResource) -> bool:
    """A NamespacePolicy applied by the operator, who may name any namespace."""
    return item.resource.kind == NAMESPACE_POLICY_KIND and who.namespace == OPERATOR_NAMESPACE


def _may_apply_policies(who: Principal, loaded: list[LoadedResource]) -> None:
    if who.namespace != OPERATOR_NAMESPACE and any(
        item.resource.kind == NAMESPACE_POLICY_KIND for item in loaded
    ):
        raise _forbidden_policy()


def _invalid(problems: list[FieldProblem]) -> ProblemError:
    return ProblemError(
        422,
        "the resource documents are invalid; nothing was applied",
        code="invalid_resource",
        errors=problems,
    )


def _not_unicode(
    where: str, *, document: int | None = None, line: int | None = None
) -> ProblemError:
    reason = "not valid Unicode text (a lone surrogate)"
    return ProblemError(
        422,
        "the resource documents are invalid; nothing was applied",
        code="invalid_resource",
        errors=[FieldProblem(field=where or None, reason=reason, document=document, line=line)],
    )


def _json_problem(problem: FieldProblem) -> FieldProblem:
    document = (problem.line - 1) // 2 if problem.line is not None else None
    return FieldProblem(field=problem.field, reason=problem.reason, document=document)


@router.get(
    "/resources",
    response_model=ResourcePage,
    summary="List resources",
    responses=responses(),
)
async def list_resources(
    who: Viewer,
    request: Request,
    kind: Annotated[str | None, Query(description=_KIND_DOC, json_schema_extra=_KIND_ENUM)] = None,
    selector: Annotated[
        str | None,
        Query(
            max_length=MAX_SELECTOR_CHARS,
            description="Only resources whose labels match: `key=value`, `key!=value`, "
            "`key` (has the label), `!key` (has not), joined by commas (all must hold).",
        ),
    ] = None,
    limit: pagination.Limit = 100,
    cursor: pagination.Cursor = None,
) -> ResourcePage:
    """The namespace's resources, by kind and name."""
    canonical = _kind(kind, "query.kind") if kind is not None else None
    chosen = _selector(selector) if selector is not None else None
    stored = await context_of(request).store.list_resources(
        who.namespace,
        canonical,
        selector=chosen,
        limit=limit + 1,
        after=pagination.position(cursor, (str, str)),
    )
    page, next_cursor = pagination.keyset_page(
        stored, limit, lambda s: (s.resource.kind, s.resource.name)
    )
    return ResourcePage(items=[_out(s) for s in page], next_cursor=next_cursor)


@router.get(
    "/resources/{kind}/{name}",
    response_model=ResourceOut,
    summary="Get a resource",
    responses=responses(404),
)
async def get_resource(
    kind: KindParam, name: NameParam, who: Viewer, request: Request
) -> ResourceOut:
    canonical = _kind(kind, "path.kind")
    stored = await context_of(request).store.get_resource(who.namespace, canonical, name)
    if stored is None:
        raise NotFoundError(f"{canonical} {name!r} not found")
    return _out(stored)


@router.delete(
    "/resources/{kind}/{name}",
    status_code=204,
    response_class=Response,
    summary="Delete a resource",
    responses=responses(403, 404, 409),
)
async def delete_resource(
    kind: KindParam, name: NameParam, who: Admin, request: Request
) -> Response:
    """Refused (409) while another resource references it; a NamespacePolicy is the
    operator's (403 for an admin of another namespace than `default`)."""
    canonical = _kind(kind, "path.kind")
    if canonical == NAMESPACE_POLICY_KIND and who.namespace != OPERATOR_NAMESPACE:
        raise _forbidden_policy()
    await context_of(request).store.delete_resource(who.namespace, canonical, name)
    return Response(status_code=204)


@router.post(
    "/resources/delete",
    status_code=204,
    response_class=Response,
    summary="Delete resources together",
    responses=responses(403, 404, 409),
)
async def delete_resources(body: ResourceDeletion, who: Admin, request: Request) -> Response:
    """All or none, in one transaction: references among them do not hold them back (two
    agents that link each other are deleted together), one from a resource not among them
    does (409); one that does not exist is 404 and nothing is deleted."""
    keys = [
        (_kind(item.kind, f"body.items[{i}].kind"), item.name) for i, item in enumerate(body.items)
    ]
    if who.namespace != OPERATOR_NAMESPACE and any(k == NAMESPACE_POLICY_KIND for k, _ in keys):
        raise _forbidden_policy()
    await context_of(request).store.delete_resources(who.namespace, keys)
    return Response(status_code=204)
