"""Helpers of the tests that need a working bubblewrap sandbox.

Where bubblewrap does not work a test that needs it is skipped on a developer's
machine, and *fails* in CI (``CI`` set): ``.ci/run`` installs bubblewrap, so a CI run
never passes silently without the sandbox tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from corral.tools.sandbox.host import SandboxHost

#: the interpreter's installation: what a sandboxed ``sys.executable`` needs to see
PYTHON_PREFIX = Path(sys.base_prefix).resolve()
#: the tests' own tool programs and MCP servers, and the examples' tools
PROGRAM_DIRS = tuple(
    (Path(__file__).parent / d).resolve()
    for d in ("tool_programs", "mcp_servers", "../examples/tools")
)
#: what the operator of the tests allows sandboxes to show: the interpreter, the
#: virtualenv (the test MCP servers import the ``mcp`` SDK from it) and the programs
#: (a checkout in a private directory, a home of mode 0700, shows nothing else: see
#: README, Isolation)
ALLOWED_PATHS = tuple(dict.fromkeys([PYTHON_PREFIX, Path(sys.prefix).resolve(), *PROGRAM_DIRS]))


def require_bwrap(host: SandboxHost) -> None:
    """Skip (locally) or fail (``CI`` set) unless bubblewrap works on ``host``."""
    probe = host.probe()
    if probe.works:
        return
    message = f"the sandbox tests need a working bubblewrap: {probe.reason}"
    if os.environ.get("CI"):
        pytest.fail(message + " (.ci/run installs the bubblewrap package)")
    pytest.skip(message)


def sandbox_host(corral_home: Path, *, search_path: str | None = None) -> SandboxHost:
    """A host whose operator allowed the test interpreter and its virtualenv."""
    return SandboxHost(
        corral_home=corral_home.resolve(), allowed_paths=ALLOWED_PATHS, search_path=search_path
    )
