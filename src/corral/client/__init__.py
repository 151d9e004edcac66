"""The Python client of Corral's HTTP API: :class:`Client` (blocking) and :class:`AsyncClient`.

    from corral.client import Client

    with Client("http://localhost:8080", token="corral_...") as corral:
        corral.apply(open("agents.yaml").read())
        task = corral.submit("assistant", "What is 17 plus 25?").task
        for event in corral.follow(task.id):
            print(event.seq, event.type)
        print(corral.get_task(task.id).output)

Bodies are the pydantic models of :mod:`corral.api`, the same ones the
server answers with; errors are the library's (:mod:`corral.core.errors`).
The URL and token default to ``CORRAL_URL`` and ``CORRAL_TOKEN``.
"""

from __future__ import annotations

from corral.client.aio import AsyncClient
from corral.client.calls import Submitted
from corral.client.sync import Client

__all__ = ["AsyncClient", "Client", "Submitted"]
