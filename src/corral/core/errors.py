"""The one exception tree of Corral.

Every error Corral raises on purpose derives from :class:`CorralError`. Vendor
exceptions (``openai``, ``anthropic``, ``httpx``, ``mcp``, ``sqlalchemy``, ``nats``) are
converted at the adapter boundary and never travel further up.

    CorralError
    ├── UserError                  bad input from a person: CLI exit code 2
    │   ├── ResourceError          an invalid resource document (file, line, field)
    │   ├── DocumentTooComplexError a YAML/JSON document over a parsing limit (``limit``)
    │   ├── NotFoundError          a named object does not exist
    │   │   └── MemoryEntryNotFoundError a Memory has no entry of a key (core/memory.py)
    │   ├── ConflictError          the operation contradicts stored state
    │   ├── AuthError              the HTTP API refused the token (401) or its role (403)
    │   ├── InvalidSessionIdError  a session id breaks the one rule (core/sessions.py)
    │   ├── SessionNotAllowedError a child run named a session not of its tree (core/sessions.py)
    │   ├── InvalidSelectorError   a malformed label selector (core/selectors.py)
    │   ├── LabelError             a run's label breaks the rule (core/labels.py)
    │   ├── MemoryInputError       an entry, key, query or filter a Memory refuses (core/memory.py)
    │   └── ConfigError            a broken CLI config file or context (cli/contexts.py)
    ├── ConfigurationError         a stored resource cannot be turned into a live object
    ├── MemoryBackendError         a Memory's remote backend failed (code; core/memory.py)
    ├── ModelError                 a model call failed (``retryable``, ``status_code``)
    │   ├── ModelTimeoutError
    │   ├── ModelConnectionError
    │   ├── EmbeddingDimensionsError an embedding model answered vectors of other dimensions
    │   └── AllModelsFailedError   every model of a fallback chain failed (models/gateway.py)
    ├── ToolError                  a tool call failed (``code``, ``reason``, ``retryable``)
    ├── BudgetExceededError        a run passed one of its limits
    ├── SystemFailed               a system run cannot go on (runtime/systems.py)
    ├── LeaseLostError             a worker's lease on a run was taken over (fencing)
    ├── StoreError                 the database could not complete an operation (store/base.py)
    ├── BusError                   the message bus (NATS) cannot be reached or set up
    ├── OutputValidationError      structured output stayed invalid after repairs
    ├── RedactedError              an error that named a secret, redacted (core/redaction.py)
    └── ApiError                   an HTTP API call failed (``status``, ``code``): the client
        ├── RateLimitedError       429: wait ``retry_after`` seconds
        └── ApiConnectionError     the API's URL could not be reached

Classes defined in other modules say where; ``tests/test_errors.py`` checks this
drawing against the classes.

Cancellation (``asyncio.CancelledError``) is a ``BaseException`` and is never
caught by handlers written against ``CorralError`` or ``Exception``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.core.messages import Embeddings


class CorralError(Exception):
    """Root of every error Corral raises on purpose."""

    code: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description, used in run records and events."""
        return {"code": self.code, "message": self.message}


class UserError(CorralError):
    """The user's input is wrong; nothing was changed."""

    code = "bad_input"


@dataclass(frozen=True)
class Location:
    """Where in a resource document something is wrong."""

    file: str | None = None
    line: int | None = None
    field: str | None = None

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file:
            parts.append(self.file if self.line is None else f"{self.file}:{self.line}")
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.field:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts)


class ResourceError(UserError):
    """A resource document is invalid; ``problems`` lists every finding."""

    code = "invalid_resource"

    def __init__(self, problems: list[tuple[Location, str]]) -> None:
        self.problems = problems
        lines = [f"{loc}: {reason}" if str(loc) else reason for loc, reason in problems]
        super().__init__("\n".join(lines))


class DocumentTooComplexError(UserError):
    """A YAML or JSON document passed a parsing limit (size, depth, nodes, aliases).

    Raised while the document is parsed, before it is expanded: ``limit`` names
    the setting (``max_depth``), ``location`` says where parsing stopped.
    """

    code = "document_too_complex"

    def __init__(self, limit: str, reason: str, location: Location | None = None) -> None:
        self.limit = limit
        self.reason = reason
        self.location = location or Location()
        where = str(self.location)
        super().__init__(f"{where}: {reason}" if where else reason)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["limit"] = self.limit
        return data


class NotFoundError(UserError):
    """A named object does not exist."""

    code = "not_found"


class ConflictError(UserError):
    """The operation contradicts stored state (for example deleting a referenced resource)."""

    code = "conflict"


class ConfigurationError(CorralError):
    """A stored resource cannot be turned into a live model, tool or agent."""

    code = "configuration_error"


class ModelError(CorralError):
    """A model call failed.

    ``retryable`` says whether the same request may succeed later (429, 5xx,
    connection errors, timeouts); ``retry_after`` carries the server's hint in
    seconds when it gave one. ``paid`` is an answer the provider billed before the
    adapter refused it (embeddings of the wrong size): its usage and cost are the
    caller's all the same, with no vectors.
    """

    code = "model_error"
    paid: Embeddings | None = None

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.endpoint = endpoint

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(retryable=self.retryable, status_code=self.status_code, endpoint=self.endpoint)
        return data


class ModelTimeoutError(ModelError):
    """A model call took longer than its endpoint's timeout."""

    code = "model_timeout"

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        super().__init__(message, retryable=True, endpoint=endpoint)


class ModelConnectionError(ModelError):
    """The model endpoint could not be reached."""

    code = "model_unreachable"

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        super().__init__(message, retryable=True, endpoint=endpoint)


class EmbeddingDimensionsError(ModelError):
    """An embedding model answered vectors of other dimensions than the caller fixed
    (a Memory's ``embedding.dimensions``): nothing is written with them. Not retryable:
    the same model answers the same size again."""

    code = "embedding_dimensions_mismatch"

    def __init__(self, message: str, *, endpoint: str | None = None) -> None:
        super().__init__(message, retryable=False, endpoint=endpoint)


class ToolErrorCode(StrEnum):
    """Stable codes of tool errors; models, clients and metrics rely on them."""

    INVALID_INPUT = "invalid_input"
    PERMISSION_DENIED = "permission_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_REJECTED = "approval_rejected"
    TIMEOUT = "timeout"
    EXECUTION_FAILED = "execution_failed"
    UNSUPPORTED_TOOL = "unsupported_tool"
    CIRCUIT_OPEN = "circuit_open"
    OUTPUT_TOO_LARGE = "output_too_large"
    BLOCKED_DESTINATION = "blocked_destination"
    UNAVAILABLE = "unavailable"
    #: a child run (``agents_exec``) ended without an answer: failed, cancelled, dead letter
    CHILD_FAILED = "child_failed"
    #: a limit of the calling run refused the call (``max_depth`` of child runs)
    BUDGET_EXCEEDED = "budget_exceeded"
    #: the tool must run sandboxed and the sandbox cannot run on this machine
    ISOLATION_UNAVAILABLE = "isolation_unavailable"
    #: the program hit one of its isolation limits (``details.limit`` names it)
    RESOURCE_EXHAUSTED = "resource_exhausted"


@dataclass(frozen=True)
class ToolErrorInfo:
    """The JSON-able body of a tool error, as stored and as shown to the model."""

    code: str
    reason: str
    retryable: bool = False
    details: dict[str, Any] = field(default_factory=dict[str, Any])


class ToolError(CorralError):
    """A tool call failed with a stable ``code``, a human ``reason`` and a ``retryable`` flag.

    ``code`` is the :class:`ToolErrorCode` (``timeout``, ``invalid_input``, ...), the
    same as ``to_dict()["code"]`` and ``info.code``.
    """

    def __init__(
        self,
        code: ToolErrorCode | str,
        reason: str,
        *,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {reason}")
        self.info = ToolErrorInfo(str(code), reason, retryable, dict(details or {}))
        self.code = self.info.code

    @property
    def retryable(self) -> bool:
        return self.info.retryable

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.info.code,
            "message": self.info.reason,
            "retryable": self.info.retryable,
            **({"details": self.info.details} if self.info.details else {}),
        }


class BudgetExceededError(CorralError):
    """A run reached one of its limits (``max_steps``, ``timeout``, ``max_tokens``,
    ``max_cost_usd``); ``inherited``: the limit was the cap its parent or system run gave it
    (what that run had left), not its agent's own."""

    code = "budget_exceeded"

    def __init__(self, limit: str, message: str, *, inherited: bool = False) -> None:
        super().__init__(message)
        self.limit = limit
        self.inherited = inherited

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["limit"] = self.limit
        if self.inherited:
            data["inherited"] = True
        return data


class LeaseLostError(CorralError):
    """A write under a lease was refused: another worker has claimed the run since."""

    code = "lease_lost"


class BusError(CorralError):
    """The message bus cannot be reached or set up (raised when it is opened).

    Once open, a bus never raises for a lost connection: its messages are hints
    about state the store holds, so a failed announcement is logged and the
    store sweep finds the work instead.
    """

    code = "bus_error"


class OutputValidationError(CorralError):
    """The model's structured output did not match the schema after the allowed repairs."""

    code = "invalid_output"


class AuthError(UserError):
    """The HTTP API refused the call: no valid token (401) or a role too low (403)."""

    code = "unauthenticated"

    def __init__(self, message: str, *, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class ApiError(CorralError):
    """An HTTP API call failed in a way that is not the caller's input: 5xx, a broken answer.

    ``status`` is the HTTP status (``None`` when no answer came), ``code`` the
    problem's stable code.
    """

    code = "api_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        if code is not None:
            self.code = code


class RateLimitedError(ApiError):
    """The token's request budget is spent (429): try again after ``retry_after`` seconds."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, status=429)
        self.retry_after = retry_after


class ApiConnectionError(ApiError):
    """The HTTP API could not be reached (refused, DNS, TLS, a dropped connection)."""

    code = "api_unreachable"

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


def sole_error(exc: BaseException) -> BaseException:
    """The one error inside a task group's exception group (at any depth), else ``exc``:
    the error itself says more than the group that carried it."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
