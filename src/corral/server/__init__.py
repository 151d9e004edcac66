"""The HTTP API server (``corral serve``): a thin front door over the library.

:func:`create_app` builds the ASGI app over a store and a bus;
:func:`corral.server.serve.serve` runs it on uvicorn with the first-start
admin token and a graceful drain on SIGTERM.
"""

from __future__ import annotations

from corral.server.app import create_app

__all__ = ["create_app"]
