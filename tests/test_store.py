"""The Store contract, run against every store URL of ``store_url``: SQLite (both paths)
and PostgreSQL (a fresh database per test, see ``databases.py``)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex

from corral.core.errors import ConfigurationError, ConflictError, NotFoundError, ResourceError
from corral.core.events import (
    Event,
    RunFinishData,
    RunStartData,
    StepStartData,
    TextDeltaData,
)
from corral.core.messages import Message, ToolCall, Usage
from corral.core.runs import PendingApproval, RunRecord, RunState
from corral.core.settings import Settings
from corral.resources.kinds import AgentSpec, SecretSpec
from corral.resources.loader import load_text
from corral.resources.secrets import REDACTED, SecretCipher, SecretResolver, redacted
from corral.store import ApplyAction, Store, StoredResource, StoreError, open_store
from corral.store.schema import DIALECT_OBJECTS, LATEST_REVISION, metadata
from corral.store.sql import MIGRATIONS_DIR, SqlStore
from corral.store.sqlite import SqliteStore
from databases import PostgresServer, on_database, rows_of
from store_helpers import create_run

SRC = Path(__file__).parent.parent / "src"

BASE = """\
apiVersion: corral/v1
kind: ModelEndpoint
metadata: {name: gpt}
spec:
  provider: scripted
  api_key: {secret: key}
---
apiVersion: corral/v1
kind: Secret
metadata: {name: key}
spec: {value: hunter2-plaintext}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: assistant}
spec:
  model: gpt
  instructions: Be brief.
"""


@pytest.fixture(params=["sqlite", "sqlite-sqlalchemy", "postgresql"], name="store_url")
def store_url_fixture(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """One URL per store backend.

    ``sqlite`` is the raw-sqlite3 fast path; ``sqlite-sqlalchemy`` the same file
    through the SQLAlchemy statements; ``postgresql`` those statements on the
    session's scratch database, wiped for the test (tests marked
    ``empty_database`` get a new, empty database, dropped afterwards).
    """
    if request.param == "postgresql":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        # Racing tests open several stores (and processes) at once: keep them well
        # inside the server's max_connections.
        monkeypatch.setenv("CORRAL_DB_POOL_SIZE", "4")
        if request.node.get_closest_marker("empty_database") is None:
            return postgres.url(postgres.scratch())
        name = postgres.create(migrated=False)
        request.addfinalizer(lambda: postgres.drop(name))
        return postgres.url(name)
    if request.param == "sqlite-sqlalchemy":
        monkeypatch.setenv("CORRAL_SQLITE_FAST_PATH", "0")
    return f"sqlite:///{tmp_path / 'state' / 'corral.db'}"


def only_sqlite(store_url: str, reason: str) -> None:
    """Skip a test that is about SQLite itself when it runs on PostgreSQL."""
    if not store_url.startswith("sqlite"):
        pytest.skip(f"SQLite only: {reason}")


@pytest.fixture(name="cipher")
def cipher_fixture() -> SecretCipher:
    return SecretCipher(key=SecretCipher.generate_key())


@pytest.fixture(name="store")
async def store_fixture(store_url: str, cipher: SecretCipher) -> AsyncIterator[Store]:
    async with await open_store(store_url, cipher=cipher) as opened:
        yield opened


def keys(items: list[StoredResource]) -> list[tuple[str, str, str]]:
    return [item.resource.key for item in items]


def sqlite_path(url: str) -> Path:
    return Path(sa.make_url(url).database or "")


# --------------------------------------------------------------------------- migrations


@pytest.mark.empty_database
async def test_migrations_create_the_schema_in_a_fresh_database(store_url: str) -> None:
    sqlite = store_url.startswith("sqlite")
    if sqlite:
        assert not sqlite_path(store_url).parent.exists()
    store = await open_store(store_url)
    await store.close()
    tables = await on_database(store_url, lambda conn: set(sa.inspect(conn).get_table_names()))
    revision = await rows_of(store_url, "SELECT version_num FROM alembic_version")
    assert {"resources", "runs", "run_events", "alembic_version"} <= tables
    assert revision == [(LATEST_REVISION,)]
    if sqlite:
        with sqlite3.connect(sqlite_path(store_url)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_the_sqlite_file_and_its_wal_and_shm_are_readable_by_their_owner_only(
    store_url: str,
) -> None:
    only_sqlite(store_url, "file permissions of the SQLite file")
    path = sqlite_path(store_url)
    previous = os.umask(0o022)  # the usual umask, which alone would make the files 0644
    try:
        async with await open_store(store_url) as store:
            await store.submit_run(RunRecord(id="run_1", namespace="default", agent="a", input="x"))
            modes = {p.name: p.stat().st_mode & 0o777 for p in path.parent.iterdir() if p.is_file()}
        assert {"corral.db", "corral.db-wal", "corral.db-shm"} <= set(modes)
        assert set(modes.values()) == {0o600}, modes
        # a database an older version created 0644 is tightened when it is opened
        path.chmod(0o644)
        async with await open_store(store_url):
            assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(previous)


async def test_migrated_schema_matches_the_table_definitions(store: Store, store_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    # SQLite reflection drops an index column's DESC, so alembic cannot compare
    # indexes with sorted columns there: those are compared by their DDL instead.
    sorted_indexes = {
        index.name: index
        for table in metadata.tables.values()
        for index in table.indexes
        if any(not isinstance(e, sa.Column) for e in index.expressions)
    }
    assert "ix_runs_claim" in sorted_indexes
    sqlite = store_url.startswith("sqlite")

    def include(obj: object, name: str | None, type_: str, reflected: bool, _: object) -> bool:
        # the vector table (memory_vectors: its column's type is the dialect's) is not in metadata
        if name is not None and name.startswith(DIALECT_OBJECTS):
            return False
        return not (sqlite and type_ == "index" and name in sorted_indexes)

    def compare(conn: sa.Connection) -> list[object]:
        context = MigrationContext.configure(conn, opts={"include_object": include})
        diff = compare_metadata(context, metadata)
        for name, index in sorted_indexes.items() if sqlite else ():
            stored = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :name"),
                {"name": name},
            ).scalar()
            expected = str(CreateIndex(index).compile(dialect=conn.dialect))
            assert "DESC" in expected
            assert " ".join(str(stored).split()) == " ".join(expected.split())
        return list(diff)

    assert await on_database(store_url, compare) == []


def test_latest_revision_is_the_head_of_the_migration_scripts() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(config).get_current_head() == LATEST_REVISION


@pytest.mark.empty_database
def test_an_up_to_date_store_opens_without_running_migrations(store_url: str) -> None:
    probe = (
        "import asyncio, sys\n"
        "from corral.store import open_store\n"
        "async def main():\n"
        f"    store = await open_store({store_url!r})\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
        "print('alembic' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }

    def run() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        )
        return proc.stdout.strip()

    assert run() == "True"  # the first open migrates
    assert run() == "False"  # the second finds the schema current and leaves alembic alone


# --------------------------------------------------------------------------- apply


async def test_apply_reports_created_unchanged_configured(store: Store) -> None:
    first = await store.apply(load_text(BASE, "base.yaml"))
    assert [(o.kind, o.action, o.generation) for o in first] == [
        ("ModelEndpoint", ApplyAction.CREATED, 1),
        ("Secret", ApplyAction.CREATED, 1),
        ("Agent", ApplyAction.CREATED, 1),
    ]
    again = await store.apply(load_text(BASE, "base.yaml"))
    assert [o.action for o in again] == [ApplyAction.UNCHANGED] * 3

    created = await store.get_resource("default", "Agent", "assistant")
    changed = await store.apply(load_text(BASE.replace("Be brief.", "Be kind."), "base.yaml"))
    assert [o.action for o in changed] == [
        ApplyAction.UNCHANGED,
        ApplyAction.UNCHANGED,
        ApplyAction.CONFIGURED,
    ]
    stored = await store.get_resource("default", "Agent", "assistant")
    assert created is not None and stored is not None
    assert stored.generation == 2
    assert stored.created_at == created.created_at
    assert stored.updated_at >= created.updated_at
    assert isinstance(stored.resource.spec, AgentSpec)
    assert stored.resource.spec.instructions == "Be kind."


async def test_labels_are_part_of_the_configuration(store: Store) -> None:
    await store.apply(load_text(BASE))
    relabelled = BASE.replace("{name: assistant}", "{name: assistant, labels: {team: a}}")
    outcomes = await store.apply(load_text(relabelled))
    assert outcomes[-1].action == ApplyAction.CONFIGURED
    stored = await store.get_resource("default", "Agent", "assistant")
    assert stored is not None and stored.resource.metadata.labels == {"team": "a"}


async def test_apply_is_all_or_nothing(store: Store) -> None:
    await store.apply(load_text(BASE))
    before = await store.list_resources("default")
    broken = BASE.replace("Be brief.", "Changed.") + (
        "---\napiVersion: corral/v1\nkind: Agent\nmetadata: {name: other}\n"
        "spec: {model: gpt, tools: [missing-tool]}\n"
    )
    with pytest.raises(ResourceError) as exc:
        await store.apply(load_text(broken, "broken.yaml"))
    assert str(exc.value) == (
        "broken.yaml:23, field 'spec.tools[0]': Tool 'missing-tool' not found in namespace 'default'"
    )
    assert await store.list_resources("default") == before


async def test_references_may_point_at_stored_resources(store: Store) -> None:
    model, secret, agent = load_text(BASE)
    await store.apply([secret, model])
    [outcome] = await store.apply([agent])
    assert outcome.action == ApplyAction.CREATED


async def test_list_and_get_are_scoped_by_namespace_and_kind(store: Store) -> None:
    await store.apply(load_text(BASE))
    await store.apply(load_text(BASE, default_namespace="team-b"))
    assert keys(await store.list_resources("default", "Agent")) == [
        ("default", "Agent", "assistant")
    ]
    assert keys(await store.list_resources("team-b")) == [
        ("team-b", "Agent", "assistant"),
        ("team-b", "ModelEndpoint", "gpt"),
        ("team-b", "Secret", "key"),
    ]
    assert await store.get_resource("default", "Agent", "nobody") is None
    assert await store.list_resources("empty") == []


async def test_delete_refuses_while_referenced_and_names_the_referrers(store: Store) -> None:
    await store.apply(load_text(BASE))
    with pytest.raises(ConflictError) as exc:
        await store.delete_resource("default", "ModelEndpoint", "gpt")
    assert "referenced by Agent 'assistant' (spec.model)" in str(exc.value)
    with pytest.raises(ConflictError, match=r"ModelEndpoint 'gpt' \(spec.api_key.secret\)"):
        await store.delete_resource("default", "Secret", "key")

    await store.delete_resource("default", "Agent", "assistant")
    await store.delete_resource("default", "ModelEndpoint", "gpt")
    assert keys(await store.list_resources("default")) == [("default", "Secret", "key")]


MUTUAL = """\
apiVersion: corral/v1
kind: Agent
metadata: {name: a}
spec: {model: gpt, links: [b]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: b}
spec: {model: gpt, links: [a]}
---
apiVersion: corral/v1
kind: Agent
metadata: {name: c}
spec: {model: gpt}
"""


async def test_resources_that_reference_each_other_are_deleted_together_or_not_at_all(
    store: Store,
) -> None:
    await store.apply(load_text(BASE + "---\n" + MUTUAL))
    # alone, each is held back by the other
    with pytest.raises(ConflictError, match=r"referenced by Agent 'b' \(spec.links\[0\]\)"):
        await store.delete_resource("default", "Agent", "a")
    with pytest.raises(ConflictError, match="referenced by Agent 'a'"):
        await store.delete_resource("default", "Agent", "b")
    # with a model both use: references from outside the group hold it back, all or none
    group = [("Agent", "a"), ("Agent", "b"), ("ModelEndpoint", "gpt")]
    with pytest.raises(
        ConflictError, match=r"ModelEndpoint 'gpt' .* referenced by Agent 'assistant'"
    ):
        await store.delete_resources("default", group)
    with pytest.raises(NotFoundError, match="Agent 'ghost' not found"):
        await store.delete_resources("default", [("Agent", "a"), ("Agent", "ghost")])
    names = {name for _, _, name in keys(await store.list_resources("default", "Agent"))}
    assert names == {"a", "b", "c", "assistant"}  # nothing went
    await store.delete_resources("default", [("Agent", "b"), ("Agent", "a"), ("Agent", "a")])
    names = {name for _, _, name in keys(await store.list_resources("default", "Agent"))}
    assert names == {"c", "assistant"}


async def test_the_resources_fingerprint_changes_with_every_apply_and_delete(
    store: Store,
) -> None:
    empty = await store.resources_fingerprint("default")
    assert empty == (0, 0, 0.0)
    await store.apply(load_text(BASE))
    seen = [empty, await store.resources_fingerprint("default")]
    await store.apply(load_text(BASE))  # unchanged: the same fingerprint
    assert await store.resources_fingerprint("default") == seen[-1]
    await store.apply(load_text(BASE.replace("Be brief.", "Be kind.")))
    seen.append(await store.resources_fingerprint("default"))
    await store.delete_resource("default", "Agent", "assistant")
    seen.append(await store.resources_fingerprint("default"))
    assert len(set(seen)) == len(seen)
    assert seen[1][0] == 3 and seen[2][:2] == (3, 4) and seen[3][:2] == (2, 2)
    # another namespace's changes are not this one's
    await store.apply(load_text(BASE, default_namespace="team-b"))
    assert await store.resources_fingerprint("default") == seen[-1]


async def test_delete_of_an_absent_resource_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="Agent 'ghost' not found in namespace 'default'"):
        await store.delete_resource("default", "Agent", "ghost")


# --------------------------------------------------------------------------- secrets


async def test_secret_values_are_stored_encrypted(store: Store, store_url: str) -> None:
    await store.apply(load_text(BASE))
    stored = await store.get_resource("default", "Secret", "key")
    assert stored is not None and isinstance(stored.resource.spec, SecretSpec)
    assert stored.resource.spec.value is None
    assert stored.resource.spec.encrypted_value
    await store.close()
    [(spec,)] = await rows_of(store_url, "SELECT spec FROM resources WHERE kind = 'Secret'")
    assert "hunter2" not in str(spec) and "encrypted_value" in str(spec)
    if store_url.startswith("sqlite"):
        for file in sqlite_path(store_url).parent.iterdir():
            assert b"hunter2" not in file.read_bytes(), file


async def test_reapplying_a_secret_compares_plaintexts(store: Store, cipher: SecretCipher) -> None:
    await store.apply(load_text(BASE))
    first = await store.get_resource("default", "Secret", "key")
    [_, same, _] = await store.apply(load_text(BASE))
    assert same.action == ApplyAction.UNCHANGED
    [_, changed, _] = await store.apply(
        load_text(BASE.replace("hunter2-plaintext", "rotated-value"))
    )
    assert changed.action == ApplyAction.CONFIGURED
    stored = await store.get_resource("default", "Secret", "key")
    assert first is not None and stored is not None
    assert isinstance(stored.resource.spec, SecretSpec) and stored.resource.spec.encrypted_value
    assert cipher.decrypt(stored.resource.spec.encrypted_value) == "rotated-value"


async def test_an_encrypted_value_of_another_key_is_rejected(store: Store) -> None:
    foreign = SecretCipher(key=SecretCipher.generate_key()).encrypt("x")
    text = f"apiVersion: corral/v1\nkind: Secret\nmetadata: {{name: s}}\nspec: {{encrypted_value: {foreign}}}\n"
    with pytest.raises(ResourceError) as exc:
        await store.apply(load_text(text, "s.yaml"))
    assert str(exc.value) == (
        "s.yaml:4, field 'spec.encrypted_value': cannot be decrypted with this store's key"
    )
    assert await store.list_resources("default") == []


async def test_resolver_reads_encrypted_values_and_the_environment(
    store: Store, cipher: SecretCipher, tmp_path: Path
) -> None:
    from_env = "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: env-key}\nspec: {from_env: MY_TOKEN}\n"
    await store.apply(load_text(BASE + "---\n" + from_env))
    settings = Settings.from_env({"CORRAL_HOME": str(tmp_path)})
    resolver = SecretResolver(store, settings, cipher=cipher, environ={"MY_TOKEN": "t0k-from-env"})
    assert await resolver.resolve("default", "key") == "hunter2-plaintext"
    assert await resolver.resolve("default", "env-key") == "t0k-from-env"

    unset = SecretResolver(store, settings, cipher=cipher, environ={})
    with pytest.raises(ConfigurationError) as exc:
        await unset.resolve("default", "env-key")
    assert "'env-key'" in str(exc.value) and "'MY_TOKEN'" in str(exc.value)
    with pytest.raises(ConfigurationError, match="Secret 'nope' not found"):
        await unset.resolve("default", "nope")
    other_key = SecretResolver(
        store, settings, cipher=SecretCipher(key=SecretCipher.generate_key())
    )
    with pytest.raises(ConfigurationError, match="another key"):
        await other_key.resolve("default", "key")


SHORT = "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: pin}\nspec:\n  value: '1234'\n"


async def test_a_secret_shorter_than_eight_characters_is_refused_unless_allow_short(
    store: Store, cipher: SecretCipher, tmp_path: Path
) -> None:
    """Redaction catches the encoded forms of a value only from 8 characters, and none
    under 4: a short secret is refused at apply (file, line, field) unless it says so."""
    with pytest.raises(ResourceError) as exc:
        await store.apply(load_text(SHORT, "pin.yaml"))
    assert str(exc.value).startswith("pin.yaml:5, field 'spec.value': ")
    assert "4 characters is too short" in str(exc.value) and "allow_short" in str(exc.value)
    foreign = cipher.encrypt("1234")
    sealed = SHORT.replace("value: '1234'", f"encrypted_value: {foreign}")
    with pytest.raises(ResourceError, match=r"spec\.encrypted_value.*allow_short"):
        await store.apply(load_text(sealed, "pin.yaml"))
    assert await store.list_resources("default") == []

    allowed = SHORT.replace("spec:\n", "spec:\n  allow_short: true\n")
    await store.apply(load_text(allowed, "pin.yaml"))
    stored = await store.get_resource("default", "Secret", "pin")
    assert stored is not None and isinstance(stored.resource.spec, SecretSpec)
    assert stored.resource.spec.allow_short and stored.resource.spec.value is None
    settings = Settings.from_env({"CORRAL_HOME": str(tmp_path)})
    assert await SecretResolver(store, settings, cipher=cipher).resolve("default", "pin") == "1234"

    # a value from the environment is first seen when it is resolved
    env = "apiVersion: corral/v1\nkind: Secret\nmetadata: {name: env-pin}\nspec: {from_env: PIN}\n"
    await store.apply(load_text(env))
    short = SecretResolver(store, settings, cipher=cipher, environ={"PIN": "12"})
    with pytest.raises(ConfigurationError, match=r"'env-pin'.*2 characters.*allow_short"):
        await short.resolve("default", "env-pin")
    await store.apply(load_text(env.replace("{from_env", "{allow_short: true, from_env")))
    assert await short.resolve("default", "env-pin") == "12"


def test_key_file_is_created_private_once_and_reused(tmp_path: Path) -> None:
    settings = Settings.from_env({"CORRAL_HOME": str(tmp_path / "home")})
    token = SecretCipher.from_settings(settings).encrypt("v")
    key_file = settings.secret_key_file
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert SecretCipher.from_settings(settings).decrypt(token) == "v"


def test_secret_key_from_settings_wins_and_supports_rotation(tmp_path: Path) -> None:
    old, new = SecretCipher.generate_key(), SecretCipher.generate_key()
    token = SecretCipher(key=old).encrypt("v")
    rotated = Settings.from_env({"CORRAL_HOME": str(tmp_path), "CORRAL_SECRET_KEY": f"{new},{old}"})
    assert SecretCipher.from_settings(rotated).decrypt(token) == "v"
    assert not rotated.secret_key_file.exists()
    with pytest.raises(ConfigurationError, match="not a valid key"):
        SecretCipher(key="not-a-key").encrypt("v")


def test_redacted_hides_secret_values_only() -> None:
    doc = {"kind": "Secret", "spec": {"value": "p", "from_env": None}}
    assert redacted(doc) == {"kind": "Secret", "spec": {"value": REDACTED, "from_env": None}}
    assert doc["spec"] == {"value": "p", "from_env": None}  # the input is untouched
    env_doc = {"kind": "Secret", "spec": {"from_env": "TOKEN"}}
    assert redacted(env_doc) == env_doc


# --------------------------------------------------------------------------- runs


def a_run(run_id: str, agent: str = "assistant", created_at: float = 1000.0) -> RunRecord:
    return RunRecord(id=run_id, namespace="default", agent=agent, input="hi", created_at=created_at)


async def test_runs_round_trip_every_field(store: Store) -> None:
    record = a_run("run_1")
    await create_run(store, record)
    assert await store.get_run("run_1") == record

    call = ToolCall("c1", "add", '{"a": 1}')
    record.state = RunState.WAITING_APPROVAL
    record.messages = [Message.user("hi"), Message.assistant("", (call,))]
    record.pending_approvals = [PendingApproval("c1", "add", '{"a": 1}', "risk high", 5.0)]
    record.usage = Usage(10, 5, 1)
    record.cost_usd = 0.25
    record.steps = 1
    record.output = {"answer": [1, 2]}
    record.error = {"code": "x", "message": "y"}
    record.started_at, record.finished_at = 1001.0, 1002.5
    await store.save_run(record)
    assert await store.get_run("run_1") == record
    assert await store.get_run("run_missing") is None


async def test_create_run_twice_conflicts_and_saving_an_unknown_run_is_not_found(
    store: Store,
) -> None:
    await create_run(store, a_run("run_1"))
    with pytest.raises(ConflictError):
        await create_run(store, a_run("run_1"))
    with pytest.raises(NotFoundError, match="run_2"):
        await store.save_run(a_run("run_2"))


async def test_list_runs_newest_first_filtered_and_limited(store: Store) -> None:
    for i, agent in enumerate(["a", "b", "a", "a"]):
        await create_run(store, a_run(f"run_{i}", agent, created_at=1000.0 + i))
    assert [r.id for r in await store.list_runs("default")] == ["run_3", "run_2", "run_1", "run_0"]
    assert [r.id for r in await store.list_runs("default", "a", limit=2)] == ["run_3", "run_2"]
    assert await store.list_runs("other") == []


async def test_list_runs_filters_by_session_and_status_time_and_counts_each_listing(
    store: Store,
) -> None:
    def run(run_id: str, session: str | None, at: float, **more: object) -> RunRecord:
        record = a_run(run_id, created_at=at)
        record.session_id = session
        for name, value in more.items():
            setattr(record, name, value)
        return record

    for record in [
        run("run_0", "ctx-1", 1000.0),
        run("run_1", "ctx-1", 1001.0, started_at=1050.0),
        run("run_2", None, 1002.0),
        run("run_3", "ctx-2", 1003.0, started_at=1004.0, finished_at=1060.0),
        run("run_4", "ctx-1", 1004.0, started_at=1005.0, finished_at=1006.0),
        # the same session id in another namespace is another session
        RunRecord(
            id="run_5",
            namespace="other",
            agent="assistant",
            input="hi",
            session_id="ctx-1",
            created_at=1005.0,
        ),
    ]:
        await create_run(store, record)

    async def listed(**filters: Any) -> list[str]:
        records = await store.list_runs("default", **filters)
        counted = await store.count_matching_runs("default", **filters)
        assert counted == len(records), filters
        return [r.id for r in records]

    assert await listed(session="ctx-1") == ["run_4", "run_1", "run_0"]
    assert await listed(session="ctx-missing") == []
    # status_at: finished_at, else started_at, else created_at; at or after the bound
    assert await listed(status_since=1050.0) == ["run_3", "run_1"]
    assert await listed(status_since=1006.0, session="ctx-1") == ["run_4", "run_1"]
    assert await listed(status_since=1006.5, session="ctx-1") == ["run_1"]
    assert await listed(session="ctx-1", states=[RunState.QUEUED], agent="assistant") == [
        "run_4",
        "run_1",
        "run_0",
    ]
    assert await listed(agent="someone") == []
    assert await store.count_matching_runs("default") == 5
    assert await store.count_matching_runs("other", session="ctx-1") == 1
    # pages of one session by the keyset cursor: each run once
    first = await store.list_runs("default", limit=2, session="ctx-1")
    last = first[-1]
    rest = await store.list_runs(
        "default", limit=2, session="ctx-1", before=(last.created_at, last.id)
    )
    assert [r.id for r in first + rest] == ["run_4", "run_1", "run_0"]
    assert [r.status_at for r in first + rest] == [1006.0, 1050.0, 1000.0]


# --------------------------------------------------------------------------- events


async def test_events_are_listed_in_order_from_a_cursor(store: Store) -> None:
    await create_run(store, a_run("run_1"))
    events = [
        Event("run_1", 1, RunStartData(agent="assistant", input="x"), ts=1.0),
        Event("run_1", 2, TextDeltaData(text="hé"), ts=2.0),
        Event("run_1", 3, RunFinishData(state="succeeded"), ts=3.0),
    ]
    await store.append_events(events[:2])
    await store.append_events(events[2:])
    await store.append_events([])
    assert await store.list_events("run_1") == events
    assert await store.list_events("run_1", after_seq=2) == events[2:]
    assert await store.list_events("run_other") == []


async def test_a_duplicate_event_stores_nothing_of_its_batch(store: Store) -> None:
    await create_run(store, a_run("run_1"))
    await store.append_events([Event("run_1", 1, RunStartData(agent="a", input="x"))])
    with pytest.raises(ConflictError):
        await store.append_events(
            [
                Event("run_1", 2, StepStartData(step=1)),
                Event("run_1", 1, RunStartData(agent="a", input="x")),
            ]
        )
    assert [e.seq for e in await store.list_events("run_1")] == [1]


async def test_events_of_an_unknown_run_are_refused(store: Store) -> None:
    with pytest.raises(ConflictError):
        await store.append_events([Event("run_ghost", 1, RunStartData(agent="a", input="x"))])


# --------------------------------------------------------------------------- failures


async def test_a_locked_database_is_a_store_error_and_changes_nothing(
    store_url: str, cipher: SecretCipher
) -> None:
    only_sqlite(store_url, "the busy timeout of a database file locked by another writer")
    # The store open_store would pick for this variant, with a short busy timeout.
    store_class = SqliteStore if Settings.from_env().sqlite_fast_path else SqlStore
    store = await store_class.open(store_url, cipher=cipher, busy_timeout_seconds=0.2)
    try:
        blocker = sqlite3.connect(sqlite_path(store_url), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="locked"):
                await store.apply(load_text(BASE))
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await store.list_resources("default") == []
    finally:
        await store.close()


async def test_an_unusable_location_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open the store"):
        await open_store(f"sqlite:///{tmp_path / 'file' / 'corral.db'}")
