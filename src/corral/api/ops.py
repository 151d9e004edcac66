"""Operations: liveness and readiness answers (``/healthz``, ``/readyz``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    detail: str = ""
