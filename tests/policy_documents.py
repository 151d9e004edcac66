"""The documents the execution-policy tests share (tests/test_execution_policy.py and
tests/test_policy_hostile.py), and how they are posted to a live server."""

from __future__ import annotations

import httpx


def agent(tools: str, execution: str | None = None, name: str = "helper") -> str:
    """The Agent ``name`` on the model ``m`` with ``tools`` (YAML flow text) and, when
    given, its own ``execution`` policy."""
    extra = f"\n  execution: {execution}" if execution is not None else ""
    return f"""
apiVersion: corral/v1
kind: Agent
metadata: {{name: {name}}}
spec:
  model: m
  tools: {tools}{extra}
"""


def post_yaml(client: httpx.Client, body: str) -> httpx.Response:
    """``POST /v1/resources`` of a YAML text, as ``corral apply`` sends it."""
    return client.post("/v1/resources", content=body, headers={"content-type": "application/yaml"})
