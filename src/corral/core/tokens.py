"""API tokens: who may call the HTTP API, in which namespace, with which role.

A token reads ``corral_<id>_<secret>``. The id (``tok_...``) finds the stored
record; the secret is 32 random bytes (hex) of which only the SHA-256 hash is
stored. A secret with 256 bits of entropy cannot be guessed or brute-forced from
its hash, so a slow password KDF (bcrypt, scrypt, argon2) would only add latency
to every request without adding safety: those exist for low-entropy human
passwords. Comparison goes through :func:`hmac.compare_digest` so that timing
says nothing about how much of a hash matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum

from corral.core.ids import new_id

TOKEN_PREFIX = "corral_"
_TOKEN = re.compile(r"^corral_(tok_[0-9a-z]{26})_([0-9a-f]{64})$")


class Role(StrEnum):
    """What a token may do in its namespace; each role includes the ones below it."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: Role) -> bool:
        """Whether this role includes ``needed``."""
        return self.rank >= needed.rank


_RANKS = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


@dataclass
class ApiToken:
    """A stored API token: everything but the secret, of which only the hash is kept."""

    id: str
    namespace: str
    role: Role
    secret_hash: str
    name: str = ""
    description: str = ""
    created_at: float = field(default_factory=time.time)
    last_used_at: float | None = None
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this token's secret (constant-time comparison of hashes)."""
        return hmac.compare_digest(hash_secret(secret), self.secret_hash)


def hash_secret(secret: str) -> str:
    """The stored form of a token secret: SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def mint_token(
    namespace: str, role: Role, *, name: str = "", description: str = ""
) -> tuple[ApiToken, str]:
    """A new token record and its plain text, which is shown once and never stored."""
    token_id = new_id("tok")
    secret = secrets.token_hex(32)
    record = ApiToken(
        id=token_id,
        namespace=namespace,
        role=Role(role),
        secret_hash=hash_secret(secret),
        name=name,
        description=description,
    )
    return record, f"{TOKEN_PREFIX}{token_id}_{secret}"


def parse_token(text: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a token's plain text, or ``None`` when it is not shaped like one."""
    match = _TOKEN.match(text.strip())
    if match is None:
        return None
    return match.group(1), match.group(2)
