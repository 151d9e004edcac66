"""``corral`` commands run in this process, as a user would type them.

A ``corral`` process spends most of a short command starting Python and importing
Corral; a test of what commands answer runs them here instead, through the same
app the console script runs (:func:`corral.cli.main.registered_app`), with the
environment the process would have had. Tests whose subject is the process itself
(signals, Ctrl-C, a worker beside the CLI, the entry point's own error line) still
start real ``corral`` processes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from typer.testing import CliRunner

from corral.cli.main import registered_app


def invoke(
    args: Sequence[str], env: Mapping[str, str], *, input: str | bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """``corral args`` in this process with exactly ``env`` as its environment; its exit
    code, stdout and stderr (stdout is not a terminal, as when piped).

    An exception the CLI did not turn into an exit code fails the test here: the
    console script would have printed it as an internal error.
    """
    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    result = CliRunner().invoke(
        registered_app(), list(args), env={**unset, **env}, input=input, catch_exceptions=True
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"corral {' '.join(args)} raised {result.exception!r}\n{result.stderr}"
        ) from result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)
