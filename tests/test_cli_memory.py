"""``corral memory write|read|search|list|delete|ingest`` against a real store in CORRAL_HOME."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from cli_harness import invoke
from server_harness import LiveServer

RESOURCES = """
apiVersion: corral/v1
kind: Memory
metadata: {name: notes}
spec: {retention: {max_entries: 2}}
---
apiVersion: corral/v1
kind: Memory
metadata: {name: diary}
spec: {scope: agent}
"""


def cli(
    home: Path,
    *args: str,
    code: int = 0,
    input: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    env = {"CORRAL_HOME": str(home), "PATH": "/usr/bin:/bin", **(env or {})}
    result = invoke(args, env, input=input)
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def test_entries_are_written_searched_listed_read_and_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(RESOURCES)
    cli(home, "apply", "-f", str(manifest))
    cli(
        home,
        "memory",
        "write",
        "notes",
        "the red door is locked",
        "--key",
        "red",
        "--meta",
        "room=hall",
    )
    cli(home, "memory", "write", "notes", "-", "--key", "blue", input="the blue door is open\n")
    hits = json.loads(cli(home, "memory", "search", "notes", 'door" OR NEAR(', "-o", "json"))
    assert sorted(h["key"] for h in hits) == ["blue", "red"]
    filtered = json.loads(
        cli(home, "memory", "search", "notes", "door", "--filter", "room=hall", "-o", "json")
    )
    assert [h["key"] for h in filtered] == ["red"]
    assert cli(home, "memory", "read", "notes", "red") == "the red door is locked\n"
    # retention: two entries at most, the oldest goes
    cli(home, "memory", "write", "notes", "a third note", "--key", "third")
    listed = json.loads(cli(home, "memory", "list", "notes", "-o", "json"))
    assert [e["key"] for e in listed] == ["blue", "third"]
    described = cli(home, "describe", "memory", "notes")
    assert "Entries:     2 in 1 scope(s)" in described and "BM25" in described
    assert "deleted" in cli(home, "memory", "delete", "notes", "blue")
    assert "no entry 'blue'" in cli(home, "memory", "delete", "notes", "blue", code=2)


def test_scopes_unknown_memories_and_huge_texts_get_clear_errors(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(RESOURCES)
    cli(home, "apply", "-f", str(manifest))
    assert "kept per agent, and no agent was given" in cli(
        home, "memory", "write", "diary", "x", code=2
    )
    cli(home, "memory", "write", "diary", "alice's day", "--agent", "alice", "--key", "d")
    assert cli(home, "memory", "search", "diary", "day", "--agent", "bob") == ""
    assert "d" in cli(home, "memory", "search", "diary", "day", "--agent", "alice")
    assert "Memory 'nowhere' not found" in cli(home, "memory", "list", "nowhere", code=2)
    huge = cli(home, "memory", "write", "notes", "-", input="x" * 20_000, code=2)
    assert "at most 16000 characters" in huge


def test_the_commands_work_on_a_server_in_remote_mode(server: LiveServer, tmp_path: Path) -> None:
    remote = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.admin}
    home = tmp_path / "unused-home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(RESOURCES + "---" + INGEST)
    cli(home, "apply", "-f", str(manifest), env=remote)
    cli(home, "memory", "write", "notes", "remote words here", "--key", "r/1", env=remote)
    hits = json.loads(cli(home, "memory", "search", "notes", "WORDS", "-o", "json", env=remote))
    assert [h["key"] for h in hits] == ["r/1"]
    assert cli(home, "memory", "read", "notes", "r/1", env=remote) == "remote words here\n"
    assert "r/1" in cli(home, "memory", "list", "notes", env=remote)
    assert "Entries:     1 in 1 scope(s)" in cli(home, "describe", "memory", "notes", env=remote)
    assert "no entry 'nope'" in cli(home, "memory", "read", "notes", "nope", code=2, env=remote)
    assert "not found" in cli(home, "memory", "list", "nowhere", code=2, env=remote)
    # the code, not the message, tells a missing entry from a missing Memory
    assert "Memory 'nowhere' not found" in cli(
        home, "memory", "read", "nowhere", "k", code=2, env=remote
    )
    assert "Memory 'nowhere' not found" in cli(
        home, "memory", "delete", "nowhere", "k", code=2, env=remote
    )
    cli(home, "memory", "delete", "notes", "r/1", env=remote)
    assert cli(home, "memory", "list", "notes", env=remote) == ""
    document = tmp_path / "doc.md"
    document.write_text("# Remote\n\nA heron waits by the water.\n")
    done = json.loads(
        cli(home, "memory", "ingest", "book", str(document), "-o", "json", env=remote)
    )
    assert done[0]["chunks"] == 1 and done[0]["keys"] == [f"{document}#0"]
    again = cli(home, "memory", "ingest", "book", str(document), env=remote)
    assert "1 chunks, 0 written (1 already there)" in again
    hits = json.loads(cli(home, "memory", "search", "book", "heron", "-o", "json", env=remote))
    assert hits[0]["metadata"] == {"source": str(document), "chunk": 0, "chunks": 1}
    assert not home.exists()  # nothing local was opened


INGEST = """
apiVersion: corral/v1
kind: Memory
metadata: {name: book}
spec: {chunking: {size: 200, overlap: 40}}
"""


def test_ingest_takes_files_directories_and_stdin_once_each(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(INGEST)
    cli(home, "apply", "-f", str(manifest))
    docs = tmp_path / "docs"
    (docs / "deep").mkdir(parents=True)
    long_text = "\n\n".join(f"Chapter {i}. The otter swims upstream today." * 3 for i in range(6))
    (docs / "a.md").write_text(long_text)
    (docs / "deep" / "b.txt").write_text("Der Fluss fließt ruhig. 川は静かに流れる。")
    (docs / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (docs / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (docs / ".hidden").write_text("not ingested")
    out = cli(home, "memory", "ingest", "book", str(docs))
    assert f"skipped {docs / 'image.png'}: not a UTF-8 text file" in out
    assert f"skipped {docs / 'latin1.txt'}: not a UTF-8 text file" in out
    assert "[1/2]" in out and "[2/2]" in out  # progress on stderr for several files
    listed = json.loads(cli(home, "memory", "list", "book", "--limit", "100", "-o", "json"))
    keys = [e["key"] for e in listed]
    assert f"{docs / 'deep' / 'b.txt'}#0" in keys
    chunks = [e for e in listed if e["key"].startswith(f"{docs / 'a.md'}#")]
    assert len(chunks) > 3 and all(len(e["text"]) <= 200 for e in chunks)
    assert all(e["metadata"]["source"] == str(docs / "a.md") for e in chunks)
    # again: nothing written twice
    assert "0 written" in cli(home, "memory", "ingest", "book", str(docs))
    assert len(json.loads(cli(home, "memory", "list", "book", "-o", "json"))) == len(listed)
    # stdin, with a prefix and metadata
    out = cli(
        home,
        "memory",
        "ingest",
        "book",
        "-",
        "--key-prefix",
        "piped",
        "--meta",
        "lang=en",
        input="A beaver builds a dam.",
    )
    assert "1 chunks, 1 written" in out
    [hit] = json.loads(cli(home, "memory", "search", "book", "beaver", "-o", "json"))
    assert hit["key"] == "piped#0"
    assert hit["metadata"] == {"lang": "en", "source": "stdin", "chunk": 0, "chunks": 1}


def test_ingest_errors_are_clear(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(INGEST)
    cli(home, "apply", "-f", str(manifest))
    assert (
        "no such file or directory"
        in cli(home, "memory", "ingest", "book", str(tmp_path / "nope"), code=2).lower()
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.md").write_text("  \n")
    out = cli(home, "memory", "ingest", "book", str(empty), code=2)
    assert "skipped" in out and "no text to ingest" in out
    assert "not found" in cli(home, "memory", "ingest", "nowhere", "-", input="x", code=2)
    assert "Traceback" not in out


AGENT_WITH_MEMORY = """
apiVersion: corral/v1
kind: Memory
metadata: {name: notes}
spec: {chunking: {size: 200, overlap: 20}}
---
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: scripted-notes}
spec:
  provider: scripted
  script:
    - tool_calls: [{name: memory_write, arguments: {text: "The launch code word is pineapple", key: launch}}]
    - tool_calls: [{name: memory_ingest, arguments: {text: "%s", key_prefix: handbook}}]
    - tool_calls: [{name: memory_search, arguments: {query: "code word", top_k: 3}}]
    - text: done
---
apiVersion: corral/v1
kind: Agent
metadata: {name: keeper}
spec: {model: scripted-notes, memory: [{ref: notes, access: write}]}
"""


def test_logs_show_what_a_run_wrote_to_and_searched_in_a_memory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    handbook = " ".join(f"Rule {i}: keep the gate shut at night." for i in range(20))
    manifest.write_text(AGENT_WITH_MEMORY % handbook)
    cli(home, "apply", "-f", str(manifest))
    cli(home, "run", "keeper", "remember and look")
    [task] = json.loads(cli(home, "tasks", "list", "-o", "json"))
    shown = cli(home, "logs", task["id"])
    assert "✎ memory notes: wrote launch, 33 chars “The launch code word is pineapple”" in shown
    assert re.search(r"✎ memory notes: ingested \d+ chunk\(s\) as handbook#N", shown), shown
    assert "⌕ memory notes: “code word” → 1 hit(s)" in shown
    assert "Traceback" not in shown


def test_describe_memory_shows_its_backend_entries_index_and_embedding(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        RESOURCES
        + """---
apiVersion: corral/v1
kind: Memory
metadata: {name: remote}
spec:
  backend: http
  http: {url: "http://127.0.0.1:9/memory/v1", allow_private: true, timeout_seconds: 2}
"""
    )
    cli(home, "apply", "-f", str(manifest))
    cli(home, "memory", "write", "notes", "hello world", "--key", "h")
    described = cli(home, "describe", "memory", "notes")
    assert "Backend:     store" in described
    assert "Entries:     1 in 1 scope(s), 11 characters" in described
    assert "Index:" in described and "Embedding:   <none> (full-text search only)" in described
    # a remote backend that is not there: described all the same, saying why (the operator
    # lets allow_private reach the loopback)
    allowed = {"CORRAL_ALLOWED_PRIVATE_DESTINATIONS": "127.0.0.1"}
    remote = cli(home, "describe", "memory", "remote", env=allowed)
    assert "Backend:     http (http://127.0.0.1:9/memory/v1)" in remote
    assert "Entries:     unavailable (memory_backend_unavailable:" in remote
    assert "Traceback" not in remote


def test_a_large_ingest_on_a_terminal_shows_a_progress_bar_on_stderr(tmp_path: Path) -> None:
    home = tmp_path / "home"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(INGEST)
    cli(home, "apply", "-f", str(manifest))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.md").write_text(f"Part {i}. The heron waits by the water. " * 40)
    controller, terminal = pty.openpty()
    env = {**os.environ, "CORRAL_HOME": str(home), "COLUMNS": "120", "TERM": "xterm"}
    env.pop("CORRAL_DB_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "memory", "ingest", "book", str(docs), "-o", "json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    # read the terminal while the command runs (a full terminal buffer would block it)
    while True:
        if select.select([controller], [], [], 1.0)[0]:
            try:
                piece = os.read(controller, 65536)
            except OSError:  # the command closed its end
                break
            if not piece:
                break
            seen += piece
        elif proc.poll() is not None:
            break
    out, _ = proc.communicate(timeout=120)
    os.close(controller)
    assert proc.returncode == 0, seen.decode(errors="replace")
    stderr = seen.decode(errors="replace")
    assert "ingest" in stderr and "100%" in stderr and "━" in stderr, stderr
    assert "[1/3]" not in stderr  # the bar, not the lines of a pipe
    # stdout stays the answer alone
    assert [d["chunks"] > 1 for d in json.loads(out)] == [True, True, True]


@pytest.mark.parametrize("mode", ["embedded", "remote"])
def test_system_run_entries_are_named_by_the_system_run_id(
    mode: str, server: LiveServer, tmp_path: Path
) -> None:
    """``--system-run`` names the agent system run whose agents' entries a Memory of
    scope system_run holds; without it, or with a run that is not a system run of the
    namespace, the command says why and exits 2."""
    from test_server_memory import CREW

    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.admin} if mode == "remote" else {}
    home = tmp_path / "home"
    manifest = tmp_path / "crew.yaml"
    manifest.write_text(CREW)
    cli(home, "apply", "-f", str(manifest), env=env)
    record = json.loads(cli(home, "systems", "run", "crew-team", "scout", "-o", "json", env=env))
    run_id = record["id"]
    assert record["state"] == "succeeded", record
    scoped = ("--system-run", run_id)
    listed = json.loads(cli(home, "memory", "list", "crew", *scoped, "-o", "json", env=env))
    assert [(e["key"], e["scope_key"]) for e in listed] == [("otters", run_id)]
    assert cli(home, "memory", "read", "crew", "otters", *scoped, env=env) == (
        "the otters sleep by the weir\n"
    )
    assert "otters" in cli(home, "memory", "search", "crew", "otters", *scoped, env=env)
    cli(home, "memory", "write", "crew", "a heron", "--key", "heron", *scoped, env=env)
    assert "deleted" in cli(home, "memory", "delete", "crew", "heron", *scoped, env=env)
    assert "no system_run was given" in cli(home, "memory", "list", "crew", code=2, env=env)
    unknown = cli(home, "memory", "list", "crew", "--system-run", "run_nope", code=2, env=env)
    assert "system run 'run_nope' not found" in unknown
