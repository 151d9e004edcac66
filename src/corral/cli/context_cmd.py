"""``corral context list|use|set|delete|current`` and ``corral completion SHELL``.

Contexts live in the config file of :mod:`corral.cli.contexts`; which settings
win over a context is in :mod:`corral.cli.connect`. Completion scripts are
typer's: the script calls ``corral`` back with ``_CORRAL_COMPLETE`` set, and
:func:`corral.cli.main.main` answers.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

import typer

from corral.cli.common import COMPLETE_ENV, EXIT_BAD_INPUT, EXIT_FAILED, escape, fail
from corral.cli.contexts import Config, ConfigError, Context, load_config, warn
from corral.cli.output import Column, View, output_option, print_list

context_app = typer.Typer(
    help="Named contexts: a server, its token and a default namespace.",
    no_args_is_help=True,
)


def context_names(incomplete: str) -> list[str]:
    """Shell completion: the contexts whose name starts with ``incomplete``."""
    try:
        names = load_config().contexts
    except ConfigError:
        return []
    return sorted(name for name in names if name.startswith(incomplete))


NAME = typer.Argument(
    ..., help="The context's name.", show_default=False, autocompletion=context_names
)
#: the longest context name
MAX_NAME_CHARS = 128


def register(app: typer.Typer) -> None:
    app.add_typer(context_app, name="context")
    app.command(name="completion")(completion)


def _config() -> Config:
    try:
        return load_config()
    except ConfigError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)


def _save(config: Config) -> None:
    try:
        config.save()
    except OSError as exc:
        fail(escape(f"cannot write {config.path}: {exc}"), EXIT_FAILED)


def _check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_CHARS:
        fail(f"a context's name has 1 to {MAX_NAME_CHARS} characters", EXIT_BAD_INPUT)
    if not name.isprintable() or name.strip() != name or any(c.isspace() for c in name):
        fail(
            escape(f"context name {name!r} has spaces or control characters"),
            EXIT_BAD_INPUT,
        )
    return name


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(escape(f"url {url!r} is not an http:// or https:// URL"), EXIT_BAD_INPUT)
    if parts.scheme == "http" and not _loopback(parts.hostname):
        warn(
            f"{url} is plain HTTP: the token crosses the network readable by anyone on the "
            "way; put TLS in front of corral serve (docs/deploy.md) and use https://"
        )
    return url.rstrip("/")


def _absolute(path: str) -> str:
    from pathlib import Path

    return path if path.startswith("~") else str(Path(path).absolute())


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class _Listed:
    """A context as ``context list`` shows it: never an inline token's value."""

    name: str
    context: Context
    current: bool

    @property
    def token(self) -> str:
        if self.context.token is not None:
            return "inline"
        return f"file {self.context.token_file}" if self.context.token_file is not None else "-"

    def document(self) -> dict[str, object]:
        return {
            "name": self.name,
            "current": self.current,
            "url": self.context.url,
            "namespace": self.context.namespace or "default",
            "token": self.token,
        }


def _context_view() -> View[_Listed]:
    return View(
        kind=lambda _: "context",
        name=lambda c: c.name,
        columns=[
            Column("CURRENT", lambda c: "*" if c.current else ""),
            Column("NAME", lambda c: c.name),
            Column("URL", lambda c: c.context.url or "(local store)"),
            Column("NAMESPACE", lambda c: c.context.namespace or "default"),
            Column("TOKEN", lambda c: c.token),
        ],
        shown_as=_Listed.document,
    )


@context_app.command("list")
def context_list(output: str = output_option()) -> None:
    """The contexts; the current one is marked with *."""
    config = _config()
    if not config.contexts and output in ("table", "wide"):
        typer.echo(
            f"no contexts in {config.path}; add one with 'corral context set NAME --url URL'",
            err=True,
        )
        return
    listed = [
        _Listed(name, context, name == config.current)
        for name, context in sorted(config.contexts.items())
    ]
    print_list(_context_view(), listed, output, namespace=None)


@context_app.command("current")
def context_current() -> None:
    """The name of the current context (exit 1 when none is set)."""
    config = _config()
    if config.current is None:
        fail(
            f"no current context in {escape(str(config.path))}; pick one with 'corral context use NAME'"
        )
    typer.echo(config.current)


@context_app.command("use")
def context_use(name: str = NAME) -> None:
    """Make NAME the current context."""
    config = _config()
    try:
        config.context(name)
    except ConfigError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)
    config.current = name
    _save(config)
    typer.echo(f"current context: {name}")


@context_app.command("set")
def context_set(
    name: str = NAME,
    url: str | None = typer.Option(
        None, "--url", help="The Corral API ('' for the local store).", metavar="URL"
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="The token, stored in the config file ('' to remove). Prefer --token-file.",
        metavar="TOKEN",
    ),
    token_file: str | None = typer.Option(
        None, "--token-file", help="A file holding the token ('' to remove).", metavar="PATH"
    ),
    namespace: str | None = typer.Option(
        None, "-n", "--namespace", help="The default namespace ('' for 'default')."
    ),
    use: bool = typer.Option(False, "--use", help="Also make it the current context."),
) -> None:
    """Create the context NAME or change the settings given; the others stay."""
    import re

    _check_name(name)
    if token and token_file:
        fail("give --token or --token-file, not both", EXIT_BAD_INPUT)
    from corral.resources.kinds import NAME_PATTERN  # (pydantic: not on --help's path)

    if namespace and not re.match(NAME_PATTERN, namespace):
        fail(
            escape(f"namespace {namespace!r}: lower case, digits, '.', '_', '-' (1-63 characters)"),
            EXIT_BAD_INPUT,
        )
    config = _config()
    created = name not in config.contexts
    context = config.contexts.setdefault(name, Context())
    if url is not None:
        context.url = _check_url(url) if url else None
    if token is not None:
        context.token = token or None
        if token:
            context.token_file = None
    if token_file is not None:
        # relative to here, not to wherever corral runs later
        context.token_file = _absolute(token_file) if token_file else None
        if token_file:
            context.token = None
    if namespace is not None:
        context.namespace = namespace or None
    if use or config.current is None:
        config.current = name
    _save(config)
    typer.echo(
        f"context {name} {'created' if created else 'changed'}"
        + (" (current)" if config.current == name else "")
    )


@context_app.command("delete")
def context_delete(name: str = NAME) -> None:
    """Delete the context NAME (if it was current, no context is current any more)."""
    config = _config()
    try:
        config.context(name)
    except ConfigError as exc:
        fail(escape(exc.message), EXIT_BAD_INPUT)
    del config.contexts[name]
    if config.current == name:
        config.current = None
    _save(config)
    typer.echo(f"context {name} deleted")


class Shell(StrEnum):
    """The shells ``corral completion`` writes a script for."""

    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion(
    ctx: typer.Context,
    shell: Shell = typer.Argument(..., help="bash, zsh or fish.", show_default=False),
) -> None:
    """Print the shell completion script for SHELL.

    \b
    bash:  corral completion bash > ~/.local/share/bash-completion/completions/corral
    zsh:   corral completion zsh > "${fpath[1]}/_corral"
    fish:  corral completion fish > ~/.config/fish/completions/corral.fish
    """
    from typer.completion import shell_complete

    completion_init()
    root = ctx.find_root().command
    code = shell_complete(root, {}, "corral", COMPLETE_ENV, f"source_{shell.value}")
    if code != 0:
        fail(f"no completion script for {shell.value}")


def completion_init() -> None:
    """Register typer's completion classes (``add_completion=False`` leaves them out)."""
    from typer._completion_classes import completion_init as register_shells

    register_shells()
