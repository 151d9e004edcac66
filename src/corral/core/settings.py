"""Process-wide settings, read from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from corral.core.errors import ConfigurationError


@dataclass(frozen=True)
class Settings:
    """Where Corral keeps its state and how it reaches it.

    ``CORRAL_HOME``   the state directory (default ``~/.corral``)
    ``CORRAL_DB_URL`` the store (default ``sqlite:///$CORRAL_HOME/corral.db``)
    ``CORRAL_SECRET_KEY`` the key encrypting inline secret values (default: a
                      key file created in ``CORRAL_HOME`` with mode 0600)
    ``CORRAL_RUN_RETENTION_DAYS`` when set, workers delete finished runs (their
                      events and approvals) older than this, every few minutes
    """

    home: Path
    db_url: str
    secret_key: str | None
    run_retention_days: float | None = None

    @property
    def workspaces(self) -> Path:
        return self.home / "workspaces"

    @property
    def secret_key_file(self) -> Path:
        return self.home / "secret.key"

    @staticmethod
    def from_env(environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("CORRAL_HOME") or Path.home() / ".corral").expanduser()
        db_url = env.get("CORRAL_DB_URL") or f"sqlite:///{home / 'corral.db'}"
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
        )
