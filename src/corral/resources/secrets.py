"""Secrets: encryption of inline values, resolution at run time, redaction for display.

A ``Secret`` either names an environment variable (``from_env``, read by the
process that resolves it) or carries a ``value``. A value is encrypted with
Fernet before it is stored, so the store only ever holds ``encrypted_value``.
The key comes from ``CORRAL_SECRET_KEY`` (one Fernet key, or several separated
by commas: the first encrypts, all decrypt, which allows rotation) or from a
key file ``$CORRAL_HOME/secret.key`` created with mode 0600 on first need.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from corral.core.errors import ConfigurationError, Location, ResourceError
from corral.core.private_files import private_directory
from corral.core.settings import Settings
from corral.resources.kinds import Resource, SecretSpec, short_secret_problem

REDACTED = "<redacted>"


def header_secret(value: str, *, owner: str, secret: str) -> str:
    """``value`` if an HTTP header may carry it, else a ``ConfigurationError`` naming ``secret``.

    A header holds visible ASCII, spaces and tabs only: a key with a newline or a non-ASCII
    character cannot be sent, and would otherwise fail every request deep in the HTTP client
    (an internal error, retried as if the next attempt could succeed). The value is not shown.
    """
    for index, char in enumerate(value):
        if not (" " <= char <= "~" or char == "\t"):
            raise ConfigurationError(
                f"{owner}: secret {secret!r} cannot be sent in an HTTP header (character "
                f"{index + 1} is {_describe(char)}; only visible ASCII, spaces and tabs are)"
            )
    return value


def _describe(char: str) -> str:
    # never the character itself when it is printable: it is part of a secret
    return "a control character" if char < " " or char == "\x7f" else "not ASCII"


class SecretCipher:
    """Encrypts and decrypts secret values; the key is loaded (or created) on first use."""

    def __init__(self, *, key: str | None = None, key_file: Path | None = None) -> None:
        if key is None and key_file is None:
            raise ValueError("give a key or a key file")
        self._key = key
        self._key_file = key_file
        self._fernet: MultiFernet | None = None

    @staticmethod
    def from_settings(settings: Settings) -> SecretCipher:
        """The cipher of ``CORRAL_SECRET_KEY``, else of the key file in ``CORRAL_HOME``."""
        return SecretCipher(key=settings.secret_key, key_file=settings.secret_key_file)

    @staticmethod
    def generate_key() -> str:
        """A new random key, suitable for ``CORRAL_SECRET_KEY``."""
        return Fernet.generate_key().decode("ascii")

    def encrypt(self, plaintext: str) -> str:
        return self._cipher().encrypt(plaintext.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        """The plaintext; :class:`ConfigurationError` when the key does not fit."""
        try:
            return self._cipher().decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise ConfigurationError(
                "cannot decrypt a secret value: it was encrypted with another key "
                "(was CORRAL_SECRET_KEY or the secret.key file changed?)"
            ) from exc

    def keys(self) -> list[str]:
        """The keys as configured, the current one first (agent tokens derive theirs from
        them, see :mod:`corral.runtime.agent_tokens`)."""
        if self._key:
            return [k.strip() for k in self._key.split(",") if k.strip()]
        return [self._read_or_create_key_file()]

    def _cipher(self) -> MultiFernet:
        if self._fernet is None:
            keys = self.keys()
            try:
                self._fernet = MultiFernet([Fernet(k.strip().encode("ascii")) for k in keys])
            except (ValueError, UnicodeError) as exc:
                raise ConfigurationError(
                    "CORRAL_SECRET_KEY is not a valid key: it must be 32 url-safe base64-encoded "
                    "bytes (or several, comma separated); generate one with "
                    "`python -c 'from cryptography.fernet import Fernet; "
                    "print(Fernet.generate_key().decode())'`"
                ) from exc
        return self._fernet

    def _read_or_create_key_file(self) -> str:
        assert self._key_file is not None
        path = self._key_file
        try:
            private_directory(path.parent)  # CORRAL_HOME
            if not path.exists():
                _create_whole(path, Fernet.generate_key())
        except OSError as exc:
            raise ConfigurationError(f"cannot create the secret key file {path}: {exc}") from exc
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeError) as exc:
            raise ConfigurationError(f"cannot read the secret key file {path}: {exc}") from exc
        if not text:
            raise ConfigurationError(f"the secret key file {path} is empty")
        return text


def _create_whole(path: Path, content: bytes) -> None:
    """Create ``path`` holding ``content`` unless it exists, atomically: the content is
    written to a file of its own first and linked into place (a hard link fails when
    the name exists), so when callers race exactly one file wins, and nobody ever reads
    it empty or half written."""
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another caller won: its key is the key
            os.link(scratch, path)
    finally:
        os.unlink(scratch)


def seal(spec: SecretSpec, previous: SecretSpec | None, cipher: SecretCipher) -> SecretSpec:
    """The spec as it is stored: ``value`` replaced by ``encrypted_value``.

    When ``previous`` (the stored spec) already holds the same plaintext, its
    ciphertext is kept, so re-applying an unchanged secret changes nothing
    (Fernet tokens differ on every encryption).
    """
    if spec.encrypted_value is not None:
        try:
            plaintext = cipher.decrypt(spec.encrypted_value)
        except ConfigurationError:
            raise ResourceError(
                [
                    (
                        Location(field="spec.encrypted_value"),
                        "cannot be decrypted with this store's key",
                    )
                ]
            ) from None
        problem = short_secret_problem(plaintext, spec.allow_short)
        if problem is not None:
            raise ResourceError([(Location(field="spec.encrypted_value"), problem)])
    elif spec.value is not None:
        plaintext = spec.value
    else:
        return spec
    if previous is not None and previous.encrypted_value is not None:
        try:
            if cipher.decrypt(previous.encrypted_value) == plaintext:
                token = previous.encrypted_value
                return SecretSpec(allow_short=spec.allow_short, encrypted_value=token)
        except ConfigurationError:
            pass  # stored under an older key: re-encrypt under the current one
    token = spec.encrypted_value or cipher.encrypt(plaintext)
    return SecretSpec(allow_short=spec.allow_short, encrypted_value=token)


class _HasResource(Protocol):
    @property
    def resource(self) -> Resource: ...


class ResourceReader(Protocol):
    """What :class:`SecretResolver` needs from a store."""

    async def get_resource(self, namespace: str, kind: str, name: str) -> _HasResource | None: ...


class SecretResolver:
    """Turns a Secret's name into its value, for the process that needs it.

    ``from_env`` secrets read ``environ`` (default: this process's
    environment); encrypted values are decrypted with ``cipher`` (default: the
    one of ``settings``).
    """

    def __init__(
        self,
        reader: ResourceReader,
        settings: Settings,
        *,
        cipher: SecretCipher | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._reader = reader
        self._cipher = cipher or SecretCipher.from_settings(settings)
        self._environ = environ

    async def resolve(self, namespace: str, name: str) -> str:
        """The secret's value; :class:`ConfigurationError` when it cannot be had."""
        stored = await self._reader.get_resource(namespace, "Secret", name)
        if stored is None:
            raise ConfigurationError(f"Secret {name!r} not found in namespace {namespace!r}")
        spec = stored.resource.spec
        assert isinstance(spec, SecretSpec)
        return self.value_of(namespace, name, spec)

    def value_of(self, namespace: str, name: str, spec: SecretSpec) -> str:
        """The value of the Secret ``name`` whose spec is ``spec`` (already read)."""
        if spec.from_env is not None:
            environ = os.environ if self._environ is None else self._environ
            value = environ.get(spec.from_env)
            if value is None:
                raise ConfigurationError(
                    f"Secret {name!r} (namespace {namespace!r}) reads the environment variable "
                    f"{spec.from_env!r}, which is not set in this process"
                )
        elif spec.encrypted_value is not None:
            value = self._cipher.decrypt(spec.encrypted_value)
        elif spec.value is not None:  # not sealed: only when built in memory, never from a store
            value = spec.value
        else:
            raise ConfigurationError(f"Secret {name!r} has no value")
        # (a value from the environment is first seen here; a stored one, before the rule)
        problem = short_secret_problem(value, spec.allow_short)
        if problem is not None:
            raise ConfigurationError(f"Secret {name!r} (namespace {namespace!r}): {problem}")
        return value


def redacted(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of a resource document safe to show: secret values replaced by ``<redacted>``."""
    result = copy.deepcopy(document)
    spec = result.get("spec")
    if result.get("kind") == "Secret" and isinstance(spec, dict):
        for key in ("value", "encrypted_value"):
            if spec.get(key) is not None:
                spec[key] = REDACTED
    return result
