"""The A2A routes without the ``a2a`` extra: each answers 501 saying what to install."""

from __future__ import annotations

from fastapi import APIRouter

from corral.server.problems import ProblemError

router = APIRouter(prefix="/a2a", include_in_schema=False)


@router.api_route("/{path:path}", methods=["GET", "POST"])
async def a2a_unavailable(path: str) -> None:
    """A2A needs the a2a-sdk package."""
    raise ProblemError(
        501,
        "A2A is not installed on this server: pip install 'corral[a2a]'",
        code="a2a_unavailable",
    )
