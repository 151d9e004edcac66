"""What the server's machine offers (``GET /v1/capabilities``): any authenticated caller.

The answer names programs and backends, never a path of ``CORRAL_HOME`` nor a URL of
the store or the bus (which may carry credentials).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from corral.api import CapabilitiesOut
from corral.runtime.capabilities import gather_capabilities
from corral.server.auth import Viewer
from corral.server.context import context_of
from corral.server.problems import responses

router = APIRouter(prefix="/v1", tags=["operations"])


@router.get(
    "/capabilities",
    response_model=CapabilitiesOut,
    summary="What this machine offers",
    responses=responses(),
)
async def capabilities(who: Viewer, request: Request) -> CapabilitiesOut:
    """The tool sandbox (bubblewrap, its version, user namespaces, what `isolation: auto`
    means here), wasmtime, the importable model providers, the store and the bus (kind,
    configured, reachable). Any role may ask."""
    del who  # authenticated, any role
    context = context_of(request)
    found = await gather_capabilities(context.settings, store=context.store)
    return CapabilitiesOut.model_validate(found)
