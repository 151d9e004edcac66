"""The CLI's config file: named contexts (a server, its token, a default namespace).

``$XDG_CONFIG_HOME/corral/config.yaml`` (``~/.config/corral/config.yaml``;
``CORRAL_CONFIG`` names another file)::

    current-context: prod
    contexts:
      prod:
        url: https://corral.example.com
        token-file: ~/.config/corral/prod.token     # or token: corral_...
        namespace: team-a
      local:
        namespace: dev                               # no url: the local store

The file is written with mode 0600 (its directory 0700). One that the group or
others may read is refused, as ssh refuses a private key: it may hold tokens
(``chmod 600`` it). A token file others may read is used with a warning (a
mounted Kubernetes secret is 0644 unless told otherwise). The file is read with
a loader that refuses aliases and deep nesting, within 64 KiB: a YAML bomb is an
error, never a hang. Every problem is a :class:`ConfigError` (exit 2).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from corral.core.errors import UserError

CONFIG_ENV = "CORRAL_CONFIG"
URL_ENV = "CORRAL_URL"
TOKEN_ENV = "CORRAL_TOKEN"
DEFAULT_NAMESPACE = "default"
#: the largest config file read; a few contexts take a few hundred bytes
MAX_CONFIG_BYTES = 64 * 1024
_MAX_DEPTH = 8
_CONTEXT_KEYS = {"url", "token", "token-file", "namespace"}
_TOP_KEYS = {"current-context", "contexts"}


class ConfigError(UserError):
    """The config file (or a token file it names) cannot be used."""


@dataclass
class Context:
    """One named context: where the CLI goes and as whom."""

    url: str | None = None
    token: str | None = None
    token_file: str | None = None
    namespace: str | None = None

    def to_yaml(self) -> dict[str, str]:
        fields = {
            "url": self.url,
            "token": self.token,
            "token-file": self.token_file,
            "namespace": self.namespace,
        }
        return {key: value for key, value in fields.items() if value is not None}

    def read_token(self, name: str) -> str | None:
        """The token: inline, or the first line of its token file."""
        if self.token is not None or self.token_file is None:
            return self.token
        path = Path(self.token_file).expanduser()
        try:
            with path.open("rb") as file:
                text = file.read(MAX_CONFIG_BYTES).decode("utf-8")
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise ConfigError(
                f"context {name!r}: token file {str(path)!r} does not exist"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"context {name!r}: cannot read token file {str(path)!r}: {exc}"
            ) from None
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            warn(f"token file {path} is readable by others (chmod 600 {path})")
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ConfigError(f"context {name!r}: token file {str(path)!r} is empty")
        return token


@dataclass
class Config:
    """The whole file: its contexts and which one is current."""

    path: Path
    current: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)

    def context(self, name: str) -> Context:
        """The context ``name``; a ConfigError naming the known ones if there is none."""
        try:
            return self.contexts[name]
        except KeyError:
            known = ", ".join(sorted(self.contexts)) or "none"
            raise ConfigError(f"no context {name!r} in {self.path} (known: {known})") from None

    def save(self) -> None:
        """Write the file, mode 0600 from its first byte (its directory 0700)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        body: dict[str, Any] = {}
        if self.current is not None:
            body["current-context"] = self.current
        body["contexts"] = {name: c.to_yaml() for name, c in self.contexts.items()}
        text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, default_flow_style=False)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
            os.chmod(temporary, 0o600)  # a umask cannot loosen it; an old file's mode is replaced
            os.replace(temporary, self.path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


@dataclass(frozen=True)
class Connection:
    """Where this command goes, and what said so (for error messages)."""

    url: str | None
    token: str | None
    namespace: str
    #: ``--url``, ``CORRAL_URL`` or ``context 'NAME'``; None without a server
    url_source: str | None = None
    #: ``-n`` or ``context 'NAME'``; None for the default namespace
    namespace_source: str | None = None
    #: the context in use (its name), if any
    context: str | None = None


def resolve(
    context: str | None = None,
    url: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Connection:
    """Where a command goes, from its root flags (``--context``, ``--url``, ``--token``),
    ``-n``, the environment and the config file (see :mod:`corral.cli.connect`)."""
    flag_token = token
    name = context
    chosen: Context | None = None
    if name is not None or not (url or os.environ.get(URL_ENV)):
        config = load_config()
        name = name if name is not None else config.current
        if name is not None:
            chosen = config.context(name)
    label = f"context {name!r}" if chosen is not None else None

    url_source = None
    if url is not None:
        url, url_source = url or None, "--url"
    elif URL_ENV in os.environ:
        url, url_source = os.environ[URL_ENV] or None, URL_ENV
    elif chosen is not None and chosen.url:
        url, url_source = chosen.url, label
    if url is None:
        url_source = None

    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if token is None and chosen is not None and url is not None and url_source == label:
        assert name is not None
        token = chosen.read_token(name)
    if flag_token is not None and url is None:
        raise ConfigError("--token needs a server: give --url, set CORRAL_URL or use a context")

    namespace_source = None
    if namespace is not None:
        namespace_source = "-n"
    else:
        namespace = DEFAULT_NAMESPACE
    if (
        namespace_source is None
        and chosen is not None
        and chosen.namespace
        and (url is None or url_source == label)
    ):
        namespace, namespace_source = chosen.namespace, label
    return Connection(url, token, namespace, url_source, namespace_source, name)


def config_path() -> Path:
    """``CORRAL_CONFIG``, else ``$XDG_CONFIG_HOME/corral/config.yaml``."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "corral" / "config.yaml"


def load_config(path: Path | None = None) -> Config:
    """The config file; an empty config when there is none."""
    path = path or config_path()
    try:
        info = path.stat()
    except FileNotFoundError:
        return Config(path)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"config file {path} is not a regular file")
    if info.st_mode & 0o077:
        raise ConfigError(
            f"config file {path} may be read by others (mode {stat.S_IMODE(info.st_mode):04o}) "
            f"and may hold tokens: chmod 600 {path}"
        )
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = path.read_bytes()[:MAX_CONFIG_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    return _parse(path, text)


def _parse(path: Path, text: str) -> Config:
    try:
        loader = _PlainLoader(text)
        try:
            body = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if body is None:
        return Config(path)
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: expected a mapping with 'contexts' and 'current-context'")
    unknown = sorted(str(key) for key in body if key not in _TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown field {unknown[0]!r} (known: contexts, current-context)"
        )
    current = body.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: current-context must be a context's name")
    raw = body.get("contexts") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: contexts must be a mapping of names to contexts")
    contexts: dict[str, Context] = {}
    for name, value in raw.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: context names are text, not {name!r}")
        contexts[name] = _context(path, name, value)
    return Config(path, current, contexts)


def _context(path: Path, name: str, value: Any) -> Context:
    if value is None:
        return Context()
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: context {name!r} must be a mapping")
    unknown = sorted(str(key) for key in value if key not in _CONTEXT_KEYS)
    if unknown:
        known = ", ".join(sorted(_CONTEXT_KEYS))
        raise ConfigError(
            f"{path}: context {name!r}: unknown field {unknown[0]!r} (known: {known})"
        )
    for key, item in value.items():
        if item is not None and not isinstance(item, str):
            raise ConfigError(f"{path}: context {name!r}: {key} must be text")
    if value.get("token") is not None and value.get("token-file") is not None:
        raise ConfigError(f"{path}: context {name!r}: give token or token-file, not both")
    return Context(
        url=value.get("url"),
        token=value.get("token"),
        token_file=value.get("token-file"),
        namespace=value.get("namespace"),
    )


class _PlainLoader(yaml.SafeLoader):
    """A safe loader for a small file of plain mappings: no aliases, shallow nesting."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                problem="aliases (*name) are not allowed in the config file",
                problem_mark=cast(yaml.error.Mark, event.start_mark),
            )
        self.depth += 1
        try:
            if self.depth > _MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    problem=f"nested deeper than {_MAX_DEPTH} levels",
                    problem_mark=cast(yaml.error.Mark, event.start_mark),
                )
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self.depth -= 1


def warn(message: str) -> None:
    """``warning: message`` on stderr."""
    import sys

    print(f"warning: {message}", file=sys.stderr)
