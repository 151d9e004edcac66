"""Make a stored ``Agent`` live: resolve its model endpoints, tools, roles and secrets."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio

from corral.core.errors import ConfigurationError, CorralError, NotFoundError
from corral.core.redaction import Redactor, remember
from corral.core.settings import Settings
from corral.engine.loop import AgentDefinition
from corral.models.base import Model, ModelSettings, NamedTool, ToolChoice
from corral.models.registry import build_model, with_fallbacks
from corral.resources.execution import (
    NAMESPACE_POLICY_KIND,
    NAMESPACE_POLICY_NAME,
    EffectivePolicy,
    NamespacePolicySpec,
    effective_policy,
    isolation_under,
    loosening_problems,
    namespace_defaults,
    python_isolation_under,
    tool_problem,
)
from corral.resources.execution_check import tool_facts
from corral.resources.isolation import IsolationSpec, capped_limits
from corral.resources.kinds import (
    AgentRoleSpec,
    AgentSpec,
    EnvValue,
    HttpAuth,
    McpServerSpec,
    ModelEndpointSpec,
    NamedToolChoice,
    SecretSpec,
    Spec,
    ToolPermissionSpec,
    ToolSpecModel,
)
from corral.resources.kinds import ToolChoice as ToolChoiceSpec
from corral.resources.memory import MemorySpec
from corral.resources.secrets import SecretResolver, header_secret
from corral.runtime.memory import check_embeds
from corral.runtime.workspaces import prepare_workspace
from corral.store.base import Store
from corral.tools import python_sandbox
from corral.tools.agents import Delegation, linked_agent_tools
from corral.tools.base import Tool
from corral.tools.governance import GovernedTool, Permissions, ToolPolicy, Toolset
from corral.tools.memory import MemoryBinding, memory_tools
from corral.tools.memory_backend import open_memory_backend
from corral.tools.registry import build_tool
from corral.tools.sandbox.host import SandboxHost
from corral.tools.wasm_budget import memory_budget

MCP_PREFIX = "mcp:"
S = TypeVar("S", bound=Spec)


def _tool_choice(
    agent: str, choice: ToolChoiceSpec | None, tools: list[GovernedTool]
) -> ToolChoice:
    """The Agent's tool choice for the models; a named tool becomes the name the model sees."""
    if not isinstance(choice, NamedToolChoice):
        return choice
    for governed in tools:
        if choice.name in (governed.tool.ref, governed.spec.name):
            return NamedTool(governed.spec.name)
    known = ", ".join(t.tool.ref for t in tools) or "none"
    raise ConfigurationError(
        f"agent {agent!r}: model_settings.tool_choice names {choice.name!r}, which is not one "
        f"of its tools ({known})"
    )


def _capped(policy: EffectivePolicy, isolation: IsolationSpec) -> IsolationSpec:
    """``isolation`` with its limits under the NamespacePolicy's ``max_tool_limits``."""
    limits = capped_limits(isolation.limits, policy.max_tool_limits)
    return (
        isolation if limits is isolation.limits else isolation.model_copy(update={"limits": limits})
    )


class AgentBuilder:
    """Resolves one namespace's resources into live agents."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        namespace: str = "default",
        delegation: Delegation | None = None,
        *,
        sandbox_host: SandboxHost | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.namespace = namespace
        #: how the linked-agent tools start child runs (an Agent with links needs one)
        self.delegation = delegation
        self.secrets = SecretResolver(store, settings)
        #: the machine's side of tool isolation; it never shows a tool this CORRAL_HOME
        self.sandbox_host = sandbox_host or SandboxHost.from_env(corral_home=settings.home)
        self._resolved: dict[str, str] = {}
        #: what else a run may echo of them: the password of a basic-auth secret
        self._derived: list[tuple[str, str]] = []
        #: the namespace's other Secrets this process can resolve (redacted too: another
        #: agent's secret may reach this agent's runs, through a file, a memory, a child)
        self._namespace_secrets: list[tuple[str, str]] = []

    async def agent_spec(self, name: str) -> AgentSpec:
        return await self._spec("Agent", name, AgentSpec)

    def redactor(self) -> Redactor:
        """A redactor of every secret resolved so far (model keys, tool and MCP secrets, and
        the other Secrets of the namespace)."""
        return Redactor([*self._resolved.items(), *self._derived, *self._namespace_secrets])

    async def build(
        self,
        name: str,
        stack: AsyncExitStack,
        *,
        output_schema: dict[str, Any] | None = None,
    ) -> AgentDefinition:
        """The live agent; models, tools and MCP sessions are closed by ``stack``.

        A ``CorralError`` that names a secret resolved by then (a server's stderr
        quoted in it) is raised redacted.
        """
        try:
            return await self._build(name, stack, output_schema)
        except CorralError as exc:
            redacted = self.redactor().error(exc)
            if redacted is exc:
                raise
            raise redacted from None  # (the original, which names the secret, stays behind)
        finally:
            remember(self.redactor())  # for the log filter, whatever became of the build

    async def _build(
        self, name: str, stack: AsyncExitStack, output_schema: dict[str, Any] | None
    ) -> AgentDefinition:
        spec = await self.agent_spec(name)
        await self._resolve_namespace_secrets()
        policy = await self.execution_policy(name, spec)
        models: list[Model] = []
        for endpoint in [spec.model, *spec.fallback_models]:
            model = await self._model(endpoint)
            stack.push_async_callback(model.aclose)
            models.append(model)
        permissions = await self.permissions(spec)
        tools = await self._tools(spec, stack, policy)
        tools += self._linked_agents(name, spec, permissions)
        tools += await self._memory_tools(spec, stack)
        names: dict[str, str] = {}
        for governed in tools:
            other = names.setdefault(governed.spec.name, governed.tool.ref)
            if other != governed.tool.ref:
                raise ConfigurationError(
                    f"agent {name!r}: tools {other!r} and {governed.tool.ref!r} both appear to "
                    f"the model as {governed.spec.name!r}"
                )
        toolset = Toolset(
            tools,
            permissions=permissions,
            approval=spec.approval,
            redactor=self.redactor(),
        )
        workspace = await anyio.to_thread.run_sync(
            prepare_workspace, self.settings, "agents", self.namespace, name
        )
        return AgentDefinition(
            name=name,
            namespace=self.namespace,
            model=with_fallbacks(models),
            toolset=toolset,
            instructions=spec.instructions,
            limits=spec.limits,
            model_settings=ModelSettings(
                temperature=spec.model_settings.temperature,
                max_output_tokens=spec.model_settings.max_output_tokens,
                tool_choice=_tool_choice(name, spec.model_settings.tool_choice, tools),
                reset_tool_choice=spec.model_settings.reset_tool_choice,
            ),
            output_schema=output_schema if output_schema is not None else spec.output_schema,
            output_retries=spec.output_retries,
            stream=spec.stream,
            workspace=workspace,
            interrupted_calls=spec.interrupted_calls,
            session_policy=spec.session,
            execution=policy.to_dict(),
            links=tuple(link.agent for link in spec.links),
            max_concurrent_runs=spec.max_concurrent_runs,
        )

    async def execution_policy(self, name: str, spec: AgentSpec) -> EffectivePolicy:
        """The agent's effective execution policy (over its namespace's NamespacePolicy).

        A policy applied after the agent that the agent would loosen is a configuration
        error here, as it would have been at apply.
        """
        found = await self.namespace_policy()
        defaults = found.execution if found is not None else None
        restricted = namespace_defaults(self.namespace)
        loosened = loosening_problems(spec.execution, defaults, restricted)
        if loosened:
            reasons = "; ".join(reason for _, reason in loosened)
            raise ConfigurationError(f"agent {name!r}: execution policy: {reasons}")
        policy = effective_policy(spec.execution, defaults, restricted)
        if found is not None and found.max_tool_limits is not None:
            policy = dataclasses.replace(policy, max_tool_limits=found.max_tool_limits)
        return policy

    async def namespace_policy(self) -> NamespacePolicySpec | None:
        """The namespace's NamespacePolicy, if it has one."""
        stored = await self.store.get_resource(
            self.namespace, NAMESPACE_POLICY_KIND, NAMESPACE_POLICY_NAME
        )
        found = stored.resource.spec if stored is not None else None
        return found if isinstance(found, NamespacePolicySpec) else None

    async def wasm_max_memory_mb(self) -> int:
        """The most memory one wasm call may have: the server's cap, and the namespace's."""
        found = await self.namespace_policy()
        cap = found.wasm.max_memory_mb if found is not None else None
        server = self.settings.wasm_max_memory_mb
        return server if cap is None else min(server, cap)

    def _under_policy(self, policy: EffectivePolicy, ref: str, spec: S) -> S:
        """``spec`` (a Tool's or McpServer's) with the isolation ``policy`` gives it."""
        facts = tool_facts(spec)
        if facts is None:
            return spec
        problem = tool_problem(policy, ref, *facts)
        if problem is not None:
            raise ConfigurationError(problem)
        if isinstance(spec, ToolSpecModel) and spec.exec is not None:
            isolation = _capped(policy, isolation_under(policy, spec.exec.isolation))
            return spec.model_copy(
                update={"exec": spec.exec.model_copy(update={"isolation": isolation})}
            )
        if isinstance(spec, ToolSpecModel) and spec.python is not None:
            python_isolation = python_isolation_under(policy, spec.python.isolation)
            if python_isolation == spec.python.isolation:
                return spec
            update = {"isolation": python_isolation, "inline": False}
            python = spec.python.model_copy(update=update)
            return spec.model_copy(update={"python": python})
        if isinstance(spec, McpServerSpec) and spec.transport == "stdio":
            isolation = _capped(policy, isolation_under(policy, spec.isolation))
            return spec.model_copy(update={"isolation": isolation})
        return spec

    async def _spec(self, kind: str, name: str, spec_type: type[S]) -> S:
        stored = await self.store.get_resource(self.namespace, kind, name)
        if stored is None:
            raise NotFoundError(f"{kind} {name!r} not found in namespace {self.namespace!r}")
        spec = stored.resource.spec
        if not isinstance(spec, spec_type):  # the store returns validated specs
            raise ConfigurationError(f"{kind} {name!r}: stored spec has the wrong type")
        return spec

    async def _resolve_namespace_secrets(self) -> None:
        """Every Secret of the namespace this process can resolve, for redaction only: one
        it cannot (an environment variable not set here) is skipped, as this agent does
        not use it (one it uses fails its build where it is used)."""
        for stored in await self.store.list_resources(self.namespace, "Secret"):
            spec = stored.resource.spec
            if not isinstance(spec, SecretSpec):
                continue
            name = stored.resource.metadata.name
            try:
                value = self.secrets.value_of(self.namespace, name, spec)
            except ConfigurationError:
                continue
            self._namespace_secrets.append((name, value))

    async def _secret(self, name: str) -> str:
        if name not in self._resolved:
            self._resolved[name] = await self.secrets.resolve(self.namespace, name)
        return self._resolved[name]

    async def _secrets_of(
        self, env: Mapping[str, str | EnvValue], auth: HttpAuth | None
    ) -> dict[str, str]:
        names = [v.secret for v in env.values() if isinstance(v, EnvValue) and v.secret]
        if auth is not None:
            names.append(auth.secret)
        resolved = {n: await self._secret(n) for n in names}
        if auth is not None and auth.type == "basic":
            self._derived.append((auth.secret, resolved[auth.secret].partition(":")[2]))
        return resolved

    async def _model(self, endpoint: str) -> Model:
        spec = await self._spec("ModelEndpoint", endpoint, ModelEndpointSpec)
        api_key = None
        if spec.api_key:
            api_key = header_secret(
                await self._secret(spec.api_key.secret),
                owner=f"model endpoint {endpoint!r}",
                secret=spec.api_key.secret,
            )
        model = build_model(endpoint, spec, api_key)
        # a key the provider's SDK found in its environment is as secret as a resolved one
        self._derived += [(f"{endpoint}-api-key", v) for v in model.credentials() if v != api_key]
        return model

    async def _tools(
        self, agent: AgentSpec, stack: AsyncExitStack, policy: EffectivePolicy
    ) -> list[GovernedTool]:
        tools: list[GovernedTool] = []
        mcp_tools: dict[str, tuple[McpServerSpec, list[Tool]]] = {}
        for entry in agent.tools:
            if not entry.startswith(MCP_PREFIX):
                spec = self._under_policy(
                    policy, entry, await self._spec("Tool", entry, ToolSpecModel)
                )
                env = spec.exec.env if spec.exec else {}
                auth = spec.http.auth if spec.http else spec.a2a.auth if spec.a2a else None
                if spec.python is not None and spec.python.isolation == "sandbox":
                    tool = await python_sandbox.create(
                        entry,
                        spec,
                        isolation=_capped(
                            policy, isolation_under(policy, IsolationSpec(mode="sandbox"))
                        ),
                        sandbox_host=self.sandbox_host,
                    )
                else:
                    tool = build_tool(
                        entry,
                        spec,
                        await self._secrets_of(env, auth),
                        sandbox_host=self.sandbox_host,
                        wasm_budget=memory_budget(self.settings.wasm_memory_budget_mb),
                        wasm_max_memory_mb=await self.wasm_max_memory_mb(),
                    )
                stack.push_async_callback(tool.aclose)
                tools.append(GovernedTool(tool, ToolPolicy.of_tool(spec)))
                continue
            server, _, pattern = entry[len(MCP_PREFIX) :].partition("/")
            if server not in mcp_tools:
                mcp_tools[server] = await self._open_mcp(server, stack, policy, entry)
            server_spec, offered = mcp_tools[server]
            chosen = [
                t for t in offered if fnmatch.fnmatchcase(t.ref, f"{MCP_PREFIX}{server}/{pattern}")
            ]
            if not chosen:
                offered_names = ", ".join(t.ref for t in offered) or "none"
                raise ConfigurationError(
                    f"{entry!r} matches no tool of MCP server {server!r} (it offers {offered_names})"
                )
            tools += [GovernedTool(t, ToolPolicy.of_mcp_server(server_spec)) for t in chosen]
        unique = {t.tool.ref: t for t in tools}  # `mcp:s/*` and `mcp:s/x` may overlap
        return list(unique.values())

    def _linked_agents(
        self, name: str, spec: AgentSpec, permissions: Permissions
    ) -> list[GovernedTool]:
        """The agents_list/agents_info/agents_exec/handoff tools of an Agent with links."""
        if not spec.links:
            return []
        if self.delegation is None:
            raise ConfigurationError(
                f"agent {name!r} links other agents, which needs a runtime that starts child runs"
            )
        tools = linked_agent_tools(
            spec.links, self.delegation, permissions.allows, max_depth=spec.limits.max_depth
        )
        # Starting a child, or handing the conversation over, is as risky as what the other
        # agent may do: medium (approval by risk).
        acting = ToolPolicy(risk="medium")
        return [
            GovernedTool(t, acting if t.ref in ("agents_exec", "handoff") else ToolPolicy())
            for t in tools
        ]

    async def _memory_tools(self, spec: AgentSpec, stack: AsyncExitStack) -> list[GovernedTool]:
        """The memory_* tools of an Agent with ``memory``, each Memory over its backend."""
        bindings = []
        for m in spec.memory:
            memory = await self._spec("Memory", m.ref, MemorySpec)
            auth = memory.http.auth if memory.http is not None else None
            secrets = await self._secrets_of({}, auth)
            embedder = None
            if memory.embedding is not None and memory.backend == "store":
                endpoint = memory.embedding.model
                check_embeds(
                    endpoint, await self._spec("ModelEndpoint", endpoint, ModelEndpointSpec)
                )
                embedder = await self._model(endpoint)
                stack.push_async_callback(embedder.aclose)
            backend = open_memory_backend(m.ref, memory, self.store, secrets, embedder)
            stack.push_async_callback(backend.aclose)
            bindings.append(MemoryBinding(m.ref, memory, m.access, backend))
        # The redactor is read at each write: every secret the agent resolved by then.
        return [
            GovernedTool(t, ToolPolicy()) for t in memory_tools(bindings, self.store, self.redactor)
        ]

    async def _open_mcp(
        self, server: str, stack: AsyncExitStack, policy: EffectivePolicy, entry: str
    ) -> tuple[McpServerSpec, list[Tool]]:
        from corral.tools.mcp import open_server_tools

        spec = self._under_policy(
            policy, entry, await self._spec("McpServer", server, McpServerSpec)
        )
        secrets = await self._secrets_of(spec.env, spec.auth)
        workspace = await anyio.to_thread.run_sync(
            prepare_workspace, self.settings, "mcp-servers", self.namespace, server
        )
        return spec, await open_server_tools(
            server, spec, secrets, stack, workspace=workspace, sandbox_host=self.sandbox_host
        )

    async def permissions(self, agent: AgentSpec) -> Permissions:
        """What the agent's roles allow (everything without roles); ``/v1/links`` checks
        ``agent:NAME`` with it as ``agents_exec`` does."""
        if not agent.roles:
            return Permissions(None)
        rules: list[tuple[str, list[str]]] = []
        for role_name in agent.roles:
            role = await self._spec("AgentRole", role_name, AgentRoleSpec)
            for perm_name in role.permissions:
                perm = await self._spec("ToolPermission", perm_name, ToolPermissionSpec)
                rules.append((perm.effect, perm.tools))
        return Permissions(rules)
