"""The resource kinds of ``apiVersion: corral/v1``.

Each kind is a pydantic model of its ``spec``; :class:`Resource` is the
envelope every document shares. Unknown fields are errors (``extra="forbid"``)
so a typo never silently does nothing.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from corral.core.addresses import url_problem
from corral.resources.execution import ExecutionSpec, NamespacePolicySpec
from corral.resources.http_auth import HttpAuth as HttpAuth  # re-exported: its old home
from corral.resources.isolation import IsolationSpec
from corral.resources.memory import MemoryAccess, MemorySpec, distinct_memories
from corral.resources.spec import Spec as Spec  # re-exported: every kind is a Spec
from corral.resources.systems import AgentSystemSpec
from corral.resources.wasm_module import module_problem

API_VERSION = "corral/v1"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
_NAME_RE = re.compile(NAME_PATTERN)

#: The validation context of a spec read back from the store. Checks that only an
#: apply should make (a rule newer than the stored resource) look at it and pass: the
#: resource keeps loading, and what it does is checked again where it is used.
STORED: dict[str, Any] = {"stored": True}

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lower case, digits, '.', '_', '-'")]
Seconds = Annotated[float, Field(gt=0)]
#: the default cap on one tool call's arguments (JSON text, in bytes)
MAX_INPUT_BYTES = 64 * 1024


class SecretRef(Spec):
    """A reference to a ``Secret`` resource by name."""

    secret: Name


class Metadata(Spec):
    name: Name
    namespace: Name = "default"
    labels: dict[str, str] = Field(default_factory=dict)


# --------------------------------------------------------------------------- ModelEndpoint

Provider = Literal["openai", "anthropic", "azure-openai", "ollama", "llama-cpp", "scripted"]
#: ``options`` of the Chat Completions providers where OpenAI-compatible servers disagree
#: (see :class:`corral.models.openai.Dialect`)
MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]
ToolCallContent = Literal["omit", "empty"]
_CHAT_COMPLETIONS_OPTIONS = {
    "max_tokens_param": get_args(MaxTokensParam),
    "tool_call_content": get_args(ToolCallContent),
}


class RetryPolicy(Spec):
    """Retries of retryable failures with exponential backoff and full jitter."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    initial_backoff_seconds: float = Field(default=0.5, ge=0)
    max_backoff_seconds: float = Field(default=20.0, ge=0)


class Pricing(Spec):
    """Prices in US dollars per million tokens."""

    input_per_million: float = Field(default=0.0, ge=0)
    output_per_million: float = Field(default=0.0, ge=0)


class ScriptedToolCall(Spec):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptedTurn(Spec):
    """One canned model turn of the ``scripted`` provider."""

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    latency_seconds: float = Field(
        0.0,
        ge=0,
        le=60,
        description="how long the turn takes to answer, as a remote model's would (benchmarks)",
    )


class ModelEndpointSpec(Spec):
    """How to reach one model.

    ``options`` carries provider-specific settings: ``api_version`` and
    ``deployment`` for ``azure-openai``; ``model_path``, ``n_ctx``,
    ``chat_format`` and ``n_threads`` for ``llama-cpp``.
    """

    provider: Provider
    model: str = ""
    base_url: str | None = None
    api_key: SecretRef | None = None
    timeout_seconds: Seconds = 60.0
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    pricing: Pricing = Field(default_factory=Pricing)
    options: dict[str, Any] = Field(default_factory=dict)
    script: list[ScriptedTurn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _provider_needs(self) -> ModelEndpointSpec:
        if self.provider in ("openai", "anthropic", "azure-openai", "ollama") and not self.model:
            raise ValueError(f"provider {self.provider!r} needs 'model'")
        if self.provider == "azure-openai" and not self.base_url:
            raise ValueError("provider 'azure-openai' needs 'base_url' (the resource endpoint)")
        if self.provider != "scripted" and self.script:
            raise ValueError("'script' is only for provider 'scripted'")
        if self.provider in ("openai", "azure-openai", "ollama"):
            for key, allowed in _CHAT_COMPLETIONS_OPTIONS.items():
                if key in self.options and self.options[key] not in allowed:
                    raise ValueError(f"options.{key} must be one of {', '.join(allowed)}")
        return self


# --------------------------------------------------------------------------- Tool

RiskLevel = Literal["low", "medium", "high"]
ToolApproval = Literal["never", "always", "inherit"]


class PythonToolSpec(Spec):
    function: str = Field(description="import path 'package.module:function'")
    path: str | None = Field(
        default=None,
        description="a directory put on sys.path before importing ('./x' is relative to the YAML file)",
    )
    inline: bool = Field(
        default=False,
        description=(
            "call a synchronous function on the event loop, not in a worker thread: for quick "
            "functions that never block (no I/O, no sleeping). It saves the thread hop per "
            "call, but while it runs nothing else in the process runs, and its timeout "
            "cannot interrupt it. Coroutine functions always run on the loop"
        ),
    )
    isolation: Literal["none", "process", "sandbox"] = Field(
        default="none",
        description=(
            "none: in the server's process, with the server's rights (its files, secret key "
            "and environment; a timed-out synchronous call keeps its thread); process: in a "
            "worker subprocess that a timeout or cancellation kills, still as the server's "
            "user; sandbox: in a subprocess inside the bubblewrap sandbox, as an exec tool "
            "runs (what a namespace's isolation 'required' gives every python tool)"
        ),
    )

    @model_validator(mode="after")
    def _import_path(self) -> PythonToolSpec:
        if ":" not in self.function:
            raise ValueError("function must look like 'package.module:function'")
        if self.inline and self.isolation != "none":
            raise ValueError(
                f"'inline' runs on the event loop; isolation {self.isolation!r} cannot"
            )
        return self


class EnvValue(Spec):
    """An environment value for an ``exec`` tool: literal text or a secret."""

    value: str | None = None
    secret: Name | None = None

    @model_validator(mode="after")
    def _one_of(self) -> EnvValue:
        if (self.value is None) == (self.secret is None):
            raise ValueError("give exactly one of 'value' or 'secret'")
        return self


class ExecToolSpec(Spec):
    command: list[str] = Field(
        min_length=1, description="argv; './x' and '../x' are relative to the YAML file"
    )
    env: dict[str, str | EnvValue] = Field(default_factory=dict)
    cwd: str | None = Field(default=None, description="relative to the agent workspace")
    isolation: IsolationSpec = Field(
        default_factory=IsolationSpec,
        description="the sandbox the program runs in (default: bubblewrap where it works)",
    )

    @model_validator(mode="after")
    def _cwd_needs_a_workspace(self) -> ExecToolSpec:
        if self.cwd is not None and self.isolation.workspace == "none":
            raise ValueError(
                "'cwd' is inside the workspace, which isolation.workspace 'none' hides"
            )
        return self


class WasiSpec(Spec):
    """What a ``wasm`` tool sees of the host beyond stdin, stdout and stderr (always there)."""

    enabled: bool = Field(
        default=False, description="grant the environment and the workspace preopen below"
    )
    preopen_workspace: Literal["ro", "rw", "none"] = Field(
        default="none", description="the agent workspace at /workspace: read-only, read-write"
    )
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _granted_only_when_enabled(self) -> WasiSpec:
        if not self.enabled and (self.preopen_workspace != "none" or self.env):
            raise ValueError("'preopen_workspace' and 'env' need 'enabled: true'")
        return self


class WasmToolSpec(Spec):
    """A WebAssembly module run with wasmtime per call: JSON on stdin, result on stdout."""

    module: str = Field(description="the .wasm file; './x' is relative to the YAML file")
    entrypoint: str = Field(default="_start", min_length=1, description="an exported function")
    fuel: int = Field(
        default=1_000_000_000, ge=1, le=10**15, description="instructions (roughly) per call"
    )
    max_memory_mb: int = Field(default=64, ge=1, le=4096, description="linear memory, MiB")
    wasi: WasiSpec = Field(default_factory=WasiSpec)

    @field_validator("module")
    @classmethod
    def _usable_module(cls, module: str, info: ValidationInfo) -> str:
        if info.context is not None and info.context.get("stored"):
            return module  # checked again when the tool is built
        if module.startswith(("./", "../")):
            return module  # made absolute by the loader, which checks it then
        problem = module_problem(module)
        if problem is not None:
            raise ValueError(problem)
        return module


class HttpToolSpec(Spec):
    """Where an ``http`` tool sends its calls.

    ``url`` is checked when the Tool is applied (:func:`corral.core.addresses.url_problem`):
    http or https, a host, no credentials, and unless ``allow_private`` no loopback,
    private or metadata address in any spelling (``2130706433``, ``0x7f.1``) and no
    ``localhost``. A stored url is not checked again when read (:data:`STORED`): every
    call checks it, resolving names, and a bad one fails the calls, not the agent.
    """

    # Declared before ``url`` so that the url's validator can read it.
    allow_private: bool = Field(
        default=False,
        description=(
            "reach the loopback, link-local and private destinations that the operator lists "
            "in CORRAL_ALLOWED_PRIVATE_DESTINATIONS (no others)"
        ),
    )
    url: str
    method: Literal["POST", "PUT"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    auth: HttpAuth | None = None

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str, info: ValidationInfo) -> str:
        return callable_url(url, info)


def callable_url(url: str, info: ValidationInfo) -> str:
    """``url`` when an outbound tool may call it (see :class:`HttpToolSpec`); a stored
    one is not checked again."""
    if info.context is not None and info.context.get("stored"):
        return url
    problem = url_problem(url, allow_private=info.data.get("allow_private") is True)
    if problem is not None:
        raise ValueError(problem)
    return url


class A2aToolSpec(Spec):
    """The remote A2A agent an ``a2a`` tool sends its calls to (``message/send``).

    ``url`` is the agent's card (``https://host/agent/.well-known/agent-card.json``) or
    its base URL (the card is read from ``/.well-known/agent-card.json`` under it),
    checked like an ``http`` tool's url; every request (the card, then the interface
    the card names) passes the SSRF guard.
    """

    # Declared before ``url`` so that the url's validator can read it.
    allow_private: bool = Field(
        default=False,
        description=(
            "reach the loopback, link-local and private destinations that the operator lists "
            "in CORRAL_ALLOWED_PRIVATE_DESTINATIONS (no others)"
        ),
    )
    url: str = Field(description="the remote agent card, or the agent's base URL")
    headers: dict[str, str] = Field(default_factory=dict)
    auth: HttpAuth | None = None

    @field_validator("url")
    @classmethod
    def _callable_url(cls, url: str, info: ValidationInfo) -> str:
        return callable_url(url, info)


#: the arguments of an ``a2a`` tool that declares none: one text message
A2A_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the message to the agent"}},
    "required": ["input"],
    "additionalProperties": False,
}


class CircuitBreakerPolicy(Spec):
    failure_threshold: int = Field(default=5, ge=1)
    reset_seconds: float = Field(default=30.0, gt=0)


class ToolSpecModel(Spec):
    """A tool an agent may call. Exactly one of ``python``, ``exec``, ``http``, ``wasm``,
    ``a2a`` is set."""

    type: Literal["python", "exec", "http", "wasm", "a2a"]
    description: str = ""
    parameters: dict[str, Any] | None = Field(
        default=None, description="JSON Schema of the arguments (python: derived when absent)"
    )
    python: PythonToolSpec | None = None
    exec: ExecToolSpec | None = None
    http: HttpToolSpec | None = None
    wasm: WasmToolSpec | None = None
    a2a: A2aToolSpec | None = None
    risk: RiskLevel = "low"
    approval: ToolApproval = "inherit"
    idempotent: bool = False
    timeout_seconds: Seconds = 30.0
    retry: RetryPolicy = Field(default_factory=lambda: RetryPolicy(max_attempts=1))
    circuit_breaker: CircuitBreakerPolicy = Field(default_factory=CircuitBreakerPolicy)
    max_output_bytes: int = Field(default=65536, ge=64)
    max_input_bytes: int = Field(
        default=MAX_INPUT_BYTES,
        ge=64,
        description="larger call arguments are refused (invalid_input) and not kept whole",
    )

    @model_validator(mode="after")
    def _matching_block(self) -> ToolSpecModel:
        blocks = {
            "python": self.python,
            "exec": self.exec,
            "http": self.http,
            "wasm": self.wasm,
            "a2a": self.a2a,
        }
        if blocks[self.type] is None:
            raise ValueError(f"type {self.type!r} needs a {self.type!r} block")
        extra = [k for k, v in blocks.items() if v is not None and k != self.type]
        if extra:
            raise ValueError(f"type {self.type!r} does not take {', '.join(extra)!s}")
        if self.type == "a2a" and self.parameters is None:
            self.parameters = dict(A2A_PARAMETERS)
        if self.type != "python" and self.parameters is None:
            raise ValueError(f"type {self.type!r} needs 'parameters' (a JSON Schema)")
        return self


# --------------------------------------------------------------------------- McpServer


class McpServerSpec(Spec):
    """An MCP server whose tools agents may use as ``mcp:SERVER/TOOL``."""

    transport: Literal["stdio", "streamable-http"]
    command: list[str] = Field(default_factory=list)
    env: dict[str, str | EnvValue] = Field(default_factory=dict)
    isolation: IsolationSpec = Field(
        default_factory=IsolationSpec,
        description="the sandbox a stdio server runs in (default: bubblewrap where it works)",
    )
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    auth: HttpAuth | None = None
    init_timeout_seconds: Seconds = 10.0
    call_timeout_seconds: Seconds = 30.0
    risk: RiskLevel = "low"
    approval: ToolApproval = "inherit"
    idempotent: bool = False
    max_output_bytes: int = Field(default=65536, ge=64)
    max_input_bytes: int = Field(
        default=MAX_INPUT_BYTES,
        ge=64,
        description="larger call arguments are refused (invalid_input) and not kept whole",
    )

    @model_validator(mode="after")
    def _transport_needs(self) -> McpServerSpec:
        if self.transport == "stdio" and not self.command:
            raise ValueError("transport 'stdio' needs 'command'")
        if self.transport == "streamable-http" and not self.url:
            raise ValueError("transport 'streamable-http' needs 'url'")
        # (a stored document holds the defaults: only another isolation is refused)
        if self.transport != "stdio" and self.isolation != IsolationSpec():
            raise ValueError("'isolation' is for transport 'stdio' (a server this one starts)")
        return self


# --------------------------------------------------------------------------- Secret


#: the shortest secret value redaction catches in every form it knows (base64 and hex forms
#: of a shorter one would match ordinary text); shorter ones need ``allow_short``
MIN_SECRET_LENGTH = 8


def short_secret_problem(value: str, allow_short: bool) -> str | None:
    """Why ``value`` may not be a Secret's value (``None``: it may)."""
    if allow_short or len(value) >= MIN_SECRET_LENGTH:
        return None
    return (
        f"a secret value of {len(value)} characters is too short to be redacted reliably "
        f"(at least {MIN_SECRET_LENGTH}); set allow_short: true to store it anyway"
    )


class SecretSpec(Spec):
    """A secret value: read from an environment variable, or stored encrypted.

    ``value`` is accepted on apply and replaced by ``encrypted_value`` before
    anything is stored; it is never written or shown in clear. A value shorter than
    :data:`MIN_SECRET_LENGTH` characters is refused unless ``allow_short`` (one read
    from the environment, when it is resolved).
    """

    allow_short: bool = Field(
        default=False,
        description=(
            "accept a value shorter than 8 characters: redaction does not catch its "
            "encoded forms, nor the value itself under 4 characters"
        ),
    )
    from_env: str | None = None
    value: str | None = None
    encrypted_value: str | None = None

    @field_validator("value")
    @classmethod
    def _long_enough(cls, value: str | None, info: ValidationInfo) -> str | None:
        problem = (
            None
            if value is None
            else short_secret_problem(value, info.data.get("allow_short", False))
        )
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> SecretSpec:
        sources = [s for s in (self.from_env, self.value, self.encrypted_value) if s is not None]
        if len(sources) != 1:
            raise ValueError("give exactly one of 'from_env' or 'value'")
        return self


# --------------------------------------------------------------------------- permissions


class ToolPermissionSpec(Spec):
    """A named rule over tool names (glob patterns such as ``add``, ``mcp:files/*``, ``*``)."""

    tools: list[str] = Field(min_length=1)
    effect: Literal["allow", "deny"] = "allow"


class AgentRoleSpec(Spec):
    """A role an agent takes: the ToolPermissions it carries."""

    permissions: list[Name] = Field(min_length=1)


# --------------------------------------------------------------------------- Agent


#: how deep child runs may nest below a run by default (``limits.max_depth``)
DEFAULT_MAX_DEPTH = 4
#: how many handoffs a run may make by default (``limits.max_handoffs``)
DEFAULT_MAX_HANDOFFS = 4


class Limits(Spec):
    max_steps: int = Field(default=10, ge=1)
    timeout_seconds: Seconds = 300.0
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        le=2**63 - 1,  # (a child's cap is stored as a 64-bit integer)
        description=(
            "input + output, whole run (its child runs' too: each is capped at what the "
            "run has left when it starts)"
        ),
    )
    max_cost_usd: float | None = Field(
        default=None, ge=0, description="whole run, its child runs' cost included"
    )
    max_depth: int = Field(
        default=DEFAULT_MAX_DEPTH,
        ge=0,
        le=32,
        description=(
            "how deep child runs (agents_exec) may nest below a run of this agent: a call "
            "that would start one deeper fails with budget_exceeded (0: no child runs)"
        ),
    )
    max_handoffs: int = Field(
        default=DEFAULT_MAX_HANDOFFS,
        ge=0,
        le=32,
        description=(
            "how many handoffs a run may have made when this agent hands off: one more "
            "fails the handoff call with budget_exceeded (0: this agent never hands off)"
        ),
    )


class AgentLink(Spec):
    """An agent this agent may call (``agents_exec``), and what it is for."""

    agent: Name
    description: str = Field(default="", max_length=2000)


class ApprovalPolicy(Spec):
    """When a tool call waits for a human: ``never``, ``always``, or from ``min_risk`` up."""

    policy: Literal["never", "always", "by_risk"] = "never"
    min_risk: RiskLevel = "high"
    expires_after_seconds: float | None = Field(
        default=None, gt=0, description="a pending approval not decided by then counts as rejected"
    )


class SessionPolicy(Spec):
    """How a session's history is kept small enough to send.

    When the visible history passes ``max_history_tokens`` (estimated at four
    characters a token), everything but the last ``keep_recent_messages`` is
    compacted: ``summarize`` asks the agent's model for a summary that replaces
    it, ``hide`` just stops sending it. Compacted messages are kept for audit.
    """

    max_history_tokens: int = Field(default=8000, ge=100)
    compaction: Literal["summarize", "hide"] = "summarize"
    keep_recent_messages: int = Field(default=6, ge=0)


class NamedToolChoice(Spec):
    """Make the model call this one tool (its name in the Agent's ``tools``, or an ``mcp:`` ref)."""

    name: str = Field(min_length=1)


ToolChoice = Literal["auto", "required", "none"] | NamedToolChoice


class ModelSettingsSpec(Spec):
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description=(
            "the most output tokens one turn may write; a run with a token or cost limit "
            "sends the provider's default, else 4096, when unset, and makes a turn only when "
            "its worst case (input + this many output tokens, at the endpoint's prices) fits "
            "in what the run has left"
        ),
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description=(
            "whether the model may (auto), must (required) or must not (none) call a tool, or "
            "must call the one named ({name: ...}); unset: the provider's default, nothing sent"
        ),
    )
    reset_tool_choice: bool = Field(
        default=True,
        description=(
            "once the run has called a tool, send 'auto' instead of a forcing tool_choice "
            "(required, or a named tool), so the model can answer with the result; false: "
            "keep forcing (the model can then never answer in text: the run ends at max_steps)"
        ),
    )


class AgentSpec(Spec):
    """An agent: a model, instructions, tools and the rules it runs under."""

    model: Name
    fallback_models: list[Name] = Field(default_factory=list)
    instructions: str = ""
    tools: list[str] = Field(default_factory=list)
    roles: list[Name] = Field(default_factory=list)
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    limits: Limits = Field(default_factory=Limits)
    model_settings: ModelSettingsSpec = Field(default_factory=ModelSettingsSpec)
    output_schema: dict[str, Any] | None = None
    output_retries: int = Field(default=2, ge=0, le=10)
    stream: bool = True
    interrupted_calls: Literal["ask", "fail"] = Field(
        default="ask",
        description="a non-idempotent call cut off by a crash: ask a human to re-run it, or fail",
    )
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="tries of a run before dead letter"
    )
    max_concurrent_runs: int | None = Field(
        default=None,
        ge=1,
        description="runs of this agent executing at once across all workers; more stay queued",
    )
    session: SessionPolicy = Field(default_factory=SessionPolicy)
    links: list[AgentLink] = Field(
        default_factory=list[AgentLink],
        description=(
            "agents this agent may call through its agents_list, agents_info and agents_exec "
            "tools: a name, or {agent, description}"
        ),
    )

    @field_validator("links", mode="before")
    @classmethod
    def _link_names(cls, links: Any) -> Any:
        """A link given as a bare name is the link with no description."""
        if isinstance(links, list):
            return [{"agent": link} if isinstance(link, str) else link for link in links]
        return links

    @field_validator("links")
    @classmethod
    def _distinct_links(cls, links: list[AgentLink]) -> list[AgentLink]:
        seen: set[str] = set()
        for link in links:
            if link.agent in seen:
                raise ValueError(f"agent {link.agent!r} is linked twice")
            seen.add(link.agent)
        return links

    memory: list[MemoryAccess] = Field(
        default_factory=list[MemoryAccess],
        description="Memories this agent may use through its memory_* tools: {ref, access}",
    )

    @field_validator("memory")
    @classmethod
    def _distinct_memories(cls, memory: list[MemoryAccess]) -> list[MemoryAccess]:
        return distinct_memories(memory)

    execution: ExecutionSpec | None = Field(
        default=None,
        description="what its tools may be and how they are isolated (over the NamespacePolicy)",
    )

    @field_validator("output_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        problem = json_schema_problem(schema) if schema is not None else None
        if problem is not None:
            raise ValueError(problem)
        return schema


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (of the draft its ``$schema`` names,
    else 2020-12), or ``None``: checked before a run that would use it exists."""
    import jsonschema  # not at the top: `corral --help` never needs it

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"
    return None


SPEC_TYPES: dict[str, type[Spec]] = {
    "ModelEndpoint": ModelEndpointSpec,
    "Tool": ToolSpecModel,
    "McpServer": McpServerSpec,
    "Agent": AgentSpec,
    "Secret": SecretSpec,
    "AgentRole": AgentRoleSpec,
    "ToolPermission": ToolPermissionSpec,
    "NamespacePolicy": NamespacePolicySpec,
    "Memory": MemorySpec,
    "AgentSystem": AgentSystemSpec,
}
KINDS = tuple(SPEC_TYPES)


class Resource(BaseModel):
    """The envelope every document shares; ``spec`` is validated per ``kind``."""

    model_config = ConfigDict(extra="forbid")

    apiVersion: Literal["corral/v1"]
    kind: str
    metadata: Metadata
    spec: Spec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.metadata.namespace, self.kind, self.metadata.name)

    def to_document(self) -> dict[str, Any]:
        """The resource as a plain document, defaults filled in."""
        return {
            "apiVersion": self.apiVersion,
            "kind": self.kind,
            "metadata": self.metadata.model_dump(mode="json"),
            "spec": self.spec.model_dump(mode="json", exclude_none=True),
        }


def kind_of(name: str) -> str:
    """Resolve a kind as users type it (``agent``, ``agents``, ``Agent``) to its canonical name."""
    lowered = name.lower()
    for kind in KINDS:
        k = kind.lower()
        if lowered in (k, k + "s", k + "es") or (k.endswith("y") and lowered == k[:-1] + "ies"):
            return kind
    raise ValueError(f"unknown kind {name!r}; kinds are {', '.join(KINDS)}")


def is_valid_name(name: str) -> bool:
    return bool(_NAME_RE.match(name))
