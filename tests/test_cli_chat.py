"""`corral chat` as a person types it: a real ``corral`` process in a pseudo-terminal
(pexpect), with readline, the slash commands and approvals decided inline; and fed
from a pipe, where nothing may wait for an answer."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from corral.cli.chat_input import HISTORY_LENGTH
from server_harness import LiveServer, apply
from test_cli_run import CALC

CORRAL = [sys.executable, "-m", "corral"]
PROMPT = "you> "
ASK = "approve? [y/N/r(eason)] "
LEFT = "\x1b[D"
UP = "\x1b[A"
CTRL_A = "\x01"
CTRL_C = "\x03"

#: the calc agent with approval, scripted for an approved call then a rejected one
CAREFUL = CALC.replace(
    '    - text: "2 + 3 = 5"',
    '    - text: "2 + 3 = 5"\n'
    "    - tool_calls: [{name: add, arguments: {a: 4, b: 4}}]\n"
    '    - text: "I was not allowed to add."\n'
    "    - tool_calls: [{name: add, arguments: {a: 1, b: 1}}]",
).replace("tools: [add]", "tools: [add]\n  approval: {policy: always}")

ECHO = """
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: parrot-model}
spec:
  provider: scripted
  script: [{text: "heard you"}, {text: "heard you again"}]
---
apiVersion: corral/v1
kind: Agent
metadata: {name: parrot}
spec: {model: parrot-model}
"""


def environment(root: Path, **extra: str) -> dict[str, str]:
    """A user's environment of its own: store, history, no inputrc, no colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "XDG_"))}
    env.update(
        CORRAL_HOME=str(root / "home"),
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
        HOME=str(root),
        INPUTRC="/dev/null",
        TERM="xterm",
        NO_COLOR="1",
        COLUMNS="200",
        **extra,
    )
    return env


def corral(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORRAL, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def spawn(env: dict[str, str], *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        CORRAL[0],
        [*CORRAL[1:], "chat", *args],
        env=env,
        encoding="utf-8",
        timeout=20,
        dimensions=(40, 200),
        # as from a terminal's shell: a suite started in the background of a script (`&`)
        # ignores SIGINT, which the child would inherit, and Ctrl-C would do nothing
        preexec_fn=_default_sigint,
    )
    # (its start is the CLI's, timed in the benchmark: a machine busy with the rest of the
    # suite has taken over 20 s to show the first prompt)
    child.expect_exact(PROMPT, timeout=90)
    return child


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return int(child.exitstatus)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = environment(tmp_path)
    (tmp_path / "agents.yaml").write_text(CAREFUL + "---" + ECHO)
    assert corral(env, "apply", "-f", str(tmp_path / "agents.yaml")).returncode == 0
    return env


def test_readline_edits_the_line_and_the_next_chat_recalls_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    history = tmp_path / "state" / "corral" / "chat_history"
    history.parent.mkdir(parents=True)
    old = [f"old line {n}" for n in range(HISTORY_LENGTH)]  # a full history, readable by all
    history.write_text("".join(f"{line}\n" for line in old))
    history.chmod(0o644)

    child = spawn(env, "parrot", "--session", "s-edit")
    child.send("wrld" + LEFT * 3 + "o" + CTRL_A + "hello \r")  # → "hello world"
    child.expect_exact("heard you")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    assert ended(child) == 0
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert history.read_text().splitlines() == [*old[2:], "hello world", "/exit"]

    child = spawn(env, "parrot", "--session", "s-recall")
    child.send(UP * 2 + "\r")  # two lines back: past /exit, to what was said
    child.expect_exact("heard you")
    child.expect_exact(PROMPT)
    child.sendeof()
    assert ended(child) == 0
    for session in ("s-edit", "s-recall"):
        shown = corral(env, "sessions", "show", session).stdout
        assert shown.splitlines() == ["[user] hello world", "[assistant] heard you"]
    assert history.read_text().splitlines()[-3:] == ["hello world", "/exit", "hello world"]
    assert len(history.read_text().splitlines()) == HISTORY_LENGTH


def test_help_by_tab_session_an_unknown_command_ctrl_c_and_exit(env: dict[str, str]) -> None:
    child = spawn(env, "parrot", "--session", "s-cmds")
    child.send("/he\t\r")  # Tab completes the command
    child.expect_exact("/approve [ID] [--reject] [REASON]")
    child.expect_exact(PROMPT)
    child.send("never said" + CTRL_C)  # drops the line, as a shell does
    child.expect_exact(PROMPT)
    child.sendline("/session")
    child.expect_exact("session s-cmds · agent parrot · namespace default · new")
    child.expect_exact(PROMPT)
    child.sendline("hi")
    child.expect_exact("heard you")
    child.sendline("/session")
    child.expect_exact("· 2 message(s)")
    child.sendline("/frobnicate now")
    child.expect_exact("unknown command /frobnicate: /help lists the commands")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    assert ended(child) == 0


def test_an_inline_approval_approved_then_one_rejected_with_a_reason(
    env: dict[str, str],
) -> None:
    child = spawn(env, "calc")
    child.sendline("What is 2 + 3?")
    child.expect(r"approval (apr_\w+): add\(\{\"a\": 2, \"b\": 3\}\)")
    child.expect_exact(ASK)
    child.sendline("y")
    child.expect_exact("add approved by")
    child.expect_exact("← add")
    child.expect_exact("2 + 3 = 5")
    child.expect_exact(PROMPT)
    child.sendline("And 4 + 4?")
    child.expect_exact(ASK)
    child.sendline("maybe")  # neither yes nor no: asked again
    child.expect_exact("answer y (approve), n or Enter (reject)")
    child.expect_exact(ASK)
    child.sendline("r")
    child.expect_exact("reason: ")
    child.sendline("not on a Friday")
    child.expect_exact("add rejected by")
    child.expect_exact(": not on a Friday")
    child.expect_exact("I was not allowed to add.")
    child.expect_exact(PROMPT)
    child.sendline("And 1 + 1?")
    child.expect_exact(ASK)
    child.send(CTRL_C)  # leaves the call pending, says how to decide it, goes on
    child.expect(r"approve: corral approvals approve (apr_\w+)")
    child.expect_exact("or decide it here: /approve")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(r"run (run_\w+) still waits for approval")
    assert ended(child) == 3
    history = Path(env["XDG_STATE_HOME"], "corral", "chat_history").read_text()
    assert "not on a Friday" not in history and "\ny\n" not in f"\n{history}"


def test_an_unknown_agent_fails_before_a_line_is_read(env: dict[str, str]) -> None:
    proc = corral(env, "chat", "nobody", stdin="hello\n")
    assert proc.returncode == 2
    assert "Agent 'nobody' not found in namespace 'default'" in proc.stderr
    assert "chatting" not in proc.stderr and "Traceback" not in proc.stderr

    assert corral(env, "chat", "parrot", "--session", "s-own", stdin="hi\n").returncode == 0
    proc = corral(env, "chat", "calc", "--session", "s-own", stdin="hello\n")
    assert proc.returncode == 2
    assert "session 's-own' belongs to agent 'parrot', not 'calc'" in proc.stderr


def test_piped_chat_prints_the_approval_command_and_goes_on(env: dict[str, str]) -> None:
    lines = b"caf\xe9?\nWhat is 2 + 3?\n/approve\nAnd 4 + 4?\n"  # the first is Latin-1
    run = subprocess.run(
        [*CORRAL, "chat", "calc"], input=lines, capture_output=True, env=env, timeout=60
    )
    proc = subprocess.CompletedProcess(
        run.args, run.returncode, run.stdout.decode(), run.stderr.decode()
    )
    assert proc.returncode == 3, proc.stderr  # the second run still waits
    assert "error: the line is not UTF-8 text; it was not sent" in proc.stderr
    assert "approve?" not in proc.stderr  # nothing was asked
    commands = re.findall(r"approve: (corral approvals approve apr_\w+)", proc.stderr)
    assert len(commands) == 2
    assert proc.stdout.splitlines() == ["2 + 3 = 5"]  # /approve followed the first run on
    waiting = re.findall(r"run (run_\w+) still waits for approval", proc.stderr)
    assert len(waiting) == 1

    # the command printed is the one that works
    decided = corral(env, *commands[1].split()[1:], "-o", "json")
    assert decided.returncode == 0, decided.stderr
    assert '"state": "approved"' in decided.stdout


def test_a_remote_chat_asks_inline_and_follows_the_server_run(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "server", workers=1) as server:
        with server.client(server.admin) as client:
            apply(client, CAREFUL)
        env = environment(tmp_path, CORRAL_URL=server.url, CORRAL_TOKEN=server.admin)
        child = spawn(env, "calc")
        child.sendline("What is 2 + 3?")
        child.expect_exact(ASK)
        child.sendline("")  # Enter: no
        child.expect_exact("add rejected by")
        child.expect_exact("← add failed (approval_rejected)")
        child.expect_exact("2 + 3 = 5")  # the script's next turn, whatever the tool said
        child.expect_exact(PROMPT)
        child.sendline("/exit")
        assert ended(child) == 0
    assert not (tmp_path / "home").exists()  # nothing ran embedded
