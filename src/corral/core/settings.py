"""Process-wide settings, read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corral.core.addresses import ALLOWED_PRIVATE_VARIABLE, PrivateAllowList
from corral.core.errors import ConfigurationError
from corral.core.limits import LIMIT_VARIABLES, DocumentLimits

#: how long a SQLite write waits for another process's write lock, by default
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Settings:
    """Where Corral keeps its state and how it reaches it.

    ``CORRAL_HOME``   the state directory (default ``~/.corral``)
    ``CORRAL_DB_URL`` the store (default ``sqlite:///$CORRAL_HOME/corral.db``;
                      ``postgresql://user:password@host:5432/db`` for PostgreSQL)
    ``CORRAL_DB_POOL_SIZE`` PostgreSQL connections each process keeps open
                      (default 10; as many again are opened for bursts)
    ``CORRAL_SQLITE_FAST_PATH`` ``0`` keeps a SQLite file on the SQLAlchemy statements
                      (the ones PostgreSQL uses) instead of the raw-``sqlite3``
                      group-commit path (default ``1``)
    ``CORRAL_SQLITE_BUSY_TIMEOUT_SECONDS`` how long a SQLite write waits for another
                      process's write lock before it fails with ``store_error``
                      (default 30)
    ``CORRAL_MEMORY_VECTOR_CACHE_BYTES`` the memory each process (and store) may spend
                      on Memory vectors kept for exact vector search, least recently
                      used scopes dropped first (default 268435456, 256 MiB; 0 keeps
                      none: every vector search reads the scope's vectors again); as
                      much again on SQLite's full-text indexes of scopes (0: none, full
                      text searched by MaxScore and FTS5)
    ``CORRAL_SECRET_KEY`` the key encrypting inline secret values (default: a
                      key file created in ``CORRAL_HOME`` with mode 0600)
    ``CORRAL_RUN_RETENTION_DAYS`` when set, workers delete finished runs (their
                      events and approvals) older than this, every few minutes
    ``CORRAL_SANDBOX_ALLOWED_PATHS`` host directories a tool sandbox may show (colon
                      separated; read where tools are built and applied, see
                      :mod:`corral.resources.isolation`)
    ``CORRAL_ALLOWED_PRIVATE_DESTINATIONS`` the private destinations (addresses,
                      networks, host names; comma separated) that an outbound tool
                      with ``allow_private`` may reach; unset: none (read by the SSRF
                      guard at each call, checked here, see :mod:`corral.core.addresses`)
    ``CORRAL_WASM_MAX_MEMORY_MB`` the most linear memory one ``wasm`` call may have
                      (default 256; a Tool asking more is refused when it is built)
    ``CORRAL_WASM_MEMORY_BUDGET_MB`` what this process's ``wasm`` calls running at once
                      may reserve together (each reserves its ``max_memory_mb``;
                      default 1024): a call that does not fit waits its turn

    Limits of the YAML and JSON documents read (``corral apply``, ``POST /v1/resources``,
    tool-call arguments; see :mod:`corral.core.limits`):

    ``CORRAL_MAX_DOCUMENT_BYTES`` the largest file or body (default 1 MiB)
    ``CORRAL_MAX_DOCUMENT_DEPTH`` the deepest nesting of lists and mappings (default 64)
    ``CORRAL_MAX_DOCUMENT_NODES`` values in one file or body, aliases expanded
                      (default 100,000)
    ``CORRAL_MAX_DOCUMENT_ALIASES`` YAML alias uses in one file or body (default 1,000)

    The HTTP API (``corral serve``):

    ``CORRAL_API_HOST``, ``CORRAL_API_PORT`` where it listens (default 127.0.0.1:8080)
    ``CORRAL_PUBLIC_URL`` the URL tool programs call the API at (``CORRAL_URL`` in the
                      environment of an agent with links; default: where ``corral serve``
                      listens, and none for a worker or CLI of its own)
    ``CORRAL_API_MAX_BODY_BYTES`` the largest request body accepted (default 1 MiB)
    ``CORRAL_API_RATE_LIMIT`` requests per second per token, sustained (default 50;
                      0 turns rate limiting off)
    ``CORRAL_API_RATE_BURST`` requests a token may make at once above that rate
                      (default 100)
    ``CORRAL_API_AUTH_FAILURE_RATE`` failed authentications per second per client
                      address, sustained (default 1; 0 turns this limit off)
    ``CORRAL_API_AUTH_FAILURE_BURST`` failed authentications an address may make
                      at once above that rate (default 20)

    Scale-out (NATS JetStream; see docs/deploy.md):

    ``CORRAL_NATS_URL`` the NATS server(s), e.g. ``nats://127.0.0.1:4222`` (comma
                      separated for a cluster); unset: the in-process bus
    ``CORRAL_NATS_PREFIX`` the namespace of Corral's subjects and streams on that
                      server (default ``corral``; one per deployment)
    ``CORRAL_NATS_ACK_WAIT_SECONDS`` how long a dispatched run may go without a sign
                      of life from its worker before it is delivered again (default 30)
    ``CORRAL_NATS_MAX_DELIVER`` deliveries of one dispatch before it goes to the
                      dead-letter stream (default 5)
    """

    home: Path
    db_url: str
    secret_key: str | None
    run_retention_days: float | None = None
    db_pool_size: int = 10
    sqlite_fast_path: bool = True
    sqlite_busy_timeout_seconds: float = SQLITE_BUSY_TIMEOUT_SECONDS
    memory_vector_cache_bytes: int = 256 * 1024 * 1024
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    #: the URL tool programs reach the API at (``CORRAL_URL`` of agent tokens)
    public_url: str | None = None
    #: serve each agent's A2A card without a token (the full card stays behind one)
    a2a_public_cards: bool = False
    api_max_body_bytes: int = 1024 * 1024
    api_rate_limit: float = 50.0
    api_rate_burst: int = 100
    api_auth_failure_rate: float = 1.0
    api_auth_failure_burst: int = 20
    nats_url: str | None = None
    nats_prefix: str = "corral"
    nats_ack_wait_seconds: float = 30.0
    nats_max_deliver: int = 5
    document_limits: DocumentLimits = field(default_factory=DocumentLimits)
    wasm_max_memory_mb: int = 256
    wasm_memory_budget_mb: int = 1024

    @property
    def workspaces(self) -> Path:
        """The root of the workspaces, one directory per kind (:mod:`corral.runtime.workspaces`)."""
        return self.home / "work"

    @property
    def secret_key_file(self) -> Path:
        return self.home / "secret.key"

    @staticmethod
    def from_env(environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("CORRAL_HOME") or Path.home() / ".corral").expanduser()
        db_url = env.get("CORRAL_DB_URL") or f"sqlite:///{home / 'corral.db'}"
        try:
            PrivateAllowList.parse(env.get(ALLOWED_PRIVATE_VARIABLE, ""))
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        retention = env.get("CORRAL_RUN_RETENTION_DAYS")
        try:
            retention_days = float(retention) if retention else None
        except ValueError:
            raise ConfigurationError(
                f"CORRAL_RUN_RETENTION_DAYS must be a number of days, not {retention!r}"
            ) from None
        return Settings(
            home=home,
            db_url=db_url,
            secret_key=env.get("CORRAL_SECRET_KEY"),
            run_retention_days=retention_days,
            db_pool_size=int(_number(env, "CORRAL_DB_POOL_SIZE", 10)),
            sqlite_fast_path=env.get("CORRAL_SQLITE_FAST_PATH", "1") != "0",
            sqlite_busy_timeout_seconds=_number(
                env, "CORRAL_SQLITE_BUSY_TIMEOUT_SECONDS", SQLITE_BUSY_TIMEOUT_SECONDS, minimum=0.1
            ),
            memory_vector_cache_bytes=int(
                _number(env, "CORRAL_MEMORY_VECTOR_CACHE_BYTES", 256 * 1024 * 1024, minimum=0)
            ),
            api_host=env.get("CORRAL_API_HOST") or "127.0.0.1",
            api_port=int(_number(env, "CORRAL_API_PORT", 8080, minimum=0)),
            public_url=(env.get("CORRAL_PUBLIC_URL") or "").rstrip("/") or None,
            a2a_public_cards=env.get("CORRAL_A2A_PUBLIC_CARDS", "").lower() in ("1", "true"),
            api_max_body_bytes=int(_number(env, "CORRAL_API_MAX_BODY_BYTES", 1024 * 1024)),
            api_rate_limit=_number(env, "CORRAL_API_RATE_LIMIT", 50.0, minimum=0),
            api_rate_burst=int(_number(env, "CORRAL_API_RATE_BURST", 100)),
            api_auth_failure_rate=_number(env, "CORRAL_API_AUTH_FAILURE_RATE", 1.0, minimum=0),
            api_auth_failure_burst=int(_number(env, "CORRAL_API_AUTH_FAILURE_BURST", 20)),
            nats_url=env.get("CORRAL_NATS_URL") or None,
            nats_prefix=env.get("CORRAL_NATS_PREFIX") or "corral",
            nats_ack_wait_seconds=_number(env, "CORRAL_NATS_ACK_WAIT_SECONDS", 30.0),
            nats_max_deliver=int(_number(env, "CORRAL_NATS_MAX_DELIVER", 5, minimum=2)),
            wasm_max_memory_mb=int(_number(env, "CORRAL_WASM_MAX_MEMORY_MB", 256)),
            wasm_memory_budget_mb=int(_number(env, "CORRAL_WASM_MEMORY_BUDGET_MB", 1024)),
            document_limits=DocumentLimits(
                **{
                    limit: int(_number(env, variable, getattr(DocumentLimits, limit)))
                    for limit, variable in LIMIT_VARIABLES.items()
                }
            ),
        )


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float = 1) -> float:
    """A numeric variable, or ``default`` when unset; ``ConfigurationError`` when it is not one."""
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, not {text!r}") from None
    if value < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum:g}, not {text!r}")
    return value
