"""The SQL store: SQLAlchemy Core over an async driver (``sqlite+aiosqlite`` today).

The SQL is dialect neutral so that ``postgresql+asyncpg`` can follow. On
SQLite every connection runs in WAL mode with ``synchronous=FULL``, foreign
keys on and a busy timeout; SQLAlchemy (not the sqlite3 module) emits
``BEGIN``, and write transactions use ``BEGIN IMMEDIATE`` so that a
read-check-write (apply, delete) cannot interleave with another writer.

The schema is created and upgraded by alembic when the store opens; a store
already at :data:`~corral.store.schema.LATEST_REVISION` opens without
importing alembic at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.core.errors import ConfigurationError, ConflictError, NotFoundError, ResourceError
from corral.core.events import Event, EventType
from corral.core.messages import Usage, dump, load, load_messages
from corral.core.runs import PendingApproval, RunRecord, RunState
from corral.resources.kinds import API_VERSION, SPEC_TYPES, Metadata, Resource, SecretSpec, Spec
from corral.resources.loader import LoadedResource, format_path
from corral.resources.references import check_references, locate, referrers, resource_of
from corral.resources.secrets import SecretCipher, seal
from corral.store.base import ApplyAction, ApplyOutcome, Store, StoredResource, StoreError
from corral.store.schema import LATEST_REVISION, resources, run_events, runs

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
BUSY_TIMEOUT_SECONDS = 30.0
_WRITE = "corral_write"


def async_url(url: str) -> sa.URL:
    """``sqlite:///x.db`` -> ``sqlite+aiosqlite:///x.db``; ``postgresql://`` -> ``+asyncpg``."""
    try:
        parsed = sa.make_url(url)
    except sa_exc.ArgumentError as exc:
        raise ConfigurationError(f"invalid database URL {url!r}: {exc}") from exc
    driver = parsed.drivername
    if driver == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    if driver in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    return parsed


class SqlStore(Store):
    """A :class:`Store` on a SQL database. Create it with :meth:`open`."""

    def __init__(self, engine: AsyncEngine, cipher: SecretCipher) -> None:
        self._engine = engine
        # Same pool; connections from here open write transactions (BEGIN IMMEDIATE on SQLite).
        self._writer = engine.execution_options(**{_WRITE: True})
        self._cipher = cipher

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        cipher: SecretCipher,
        busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS,
    ) -> SqlStore:
        """Connect, bring the schema up to date, and return the store.

        ``busy_timeout_seconds`` is how long SQLite waits for another writer's
        lock before the operation fails with :class:`StoreError`.
        """
        target = async_url(url)
        with _db_errors("open the store"):
            if target.get_backend_name() == "sqlite":
                _prepare_sqlite_path(target)
            engine = create_async_engine(target)
            if engine.dialect.name == "sqlite":
                _configure_sqlite(engine, busy_timeout_seconds)
            store = cls(engine, cipher)
        try:
            await store._migrate()
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def close(self) -> None:
        await self._engine.dispose()

    # ----------------------------------------------------------------- migrations

    async def _migrate(self) -> None:
        with _db_errors("migrate the store"):
            async with self._engine.connect() as conn:
                current = await conn.run_sync(_current_revision)
            if current == LATEST_REVISION:
                return
            async with self._writer.begin() as conn:
                # Re-checked under the write lock: another process may have just migrated.
                await conn.run_sync(_upgrade)

    # ----------------------------------------------------------------- resources

    async def apply(self, batch: Sequence[Resource | LoadedResource]) -> list[ApplyOutcome]:
        items = list(batch)
        _check_kinds(items)
        now = time.time()
        with _db_errors("apply resources"):
            async with self._writer.begin() as conn:

                async def exists(namespace: str, kind: str, name: str) -> bool:
                    return await _fetch_resource(conn, namespace, kind, name) is not None

                await check_references(items, exists)
                outcomes: list[ApplyOutcome] = []
                for item in items:
                    outcomes.append(await self._apply_one(conn, item, now))
        return outcomes

    async def _apply_one(
        self, conn: AsyncConnection, item: Resource | LoadedResource, now: float
    ) -> ApplyOutcome:
        resource = resource_of(item)
        namespace, kind, name = resource.key
        row = await _fetch_resource(conn, namespace, kind, name)
        old = _row_to_stored(row) if row is not None else None
        spec = resource.spec
        if isinstance(spec, SecretSpec):
            previous = old.resource.spec if old is not None else None
            try:
                spec = seal(
                    spec, previous if isinstance(previous, SecretSpec) else None, self._cipher
                )
            except ResourceError as exc:
                where = locate(item, ("spec", "encrypted_value"))
                raise ResourceError([(where, reason) for _, reason in exc.problems]) from None
        values = {"spec": _spec_json(spec), "labels": dict(resource.metadata.labels)}
        if old is None:
            await conn.execute(
                resources.insert().values(
                    namespace=namespace,
                    kind=kind,
                    name=name,
                    generation=1,
                    created_at=now,
                    updated_at=now,
                    **values,
                )
            )
            return ApplyOutcome(namespace, kind, name, ApplyAction.CREATED, 1)
        current = {"spec": _spec_json(old.resource.spec), "labels": old.resource.metadata.labels}
        if current == values:
            return ApplyOutcome(namespace, kind, name, ApplyAction.UNCHANGED, old.generation)
        generation = old.generation + 1
        await conn.execute(
            resources.update()
            .where(_resource_key(namespace, kind, name))
            .values(generation=generation, updated_at=now, **values)
        )
        return ApplyOutcome(namespace, kind, name, ApplyAction.CONFIGURED, generation)

    async def get_resource(self, namespace: str, kind: str, name: str) -> StoredResource | None:
        with _db_errors("read a resource"):
            async with self._engine.connect() as conn:
                row = await _fetch_resource(conn, namespace, kind, name)
        return _row_to_stored(row) if row is not None else None

    async def list_resources(self, namespace: str, kind: str | None = None) -> list[StoredResource]:
        query = sa.select(resources).where(resources.c.namespace == namespace)
        if kind is not None:
            query = query.where(resources.c.kind == kind)
        query = query.order_by(resources.c.kind, resources.c.name)
        with _db_errors("list resources"):
            async with self._engine.connect() as conn:
                rows = (await conn.execute(query)).all()
        return [_row_to_stored(row) for row in rows]

    async def delete_resource(self, namespace: str, kind: str, name: str) -> None:
        with _db_errors("delete a resource"):
            async with self._writer.begin() as conn:
                if await _fetch_resource(conn, namespace, kind, name) is None:
                    raise NotFoundError(f"{kind} {name!r} not found in namespace {namespace!r}")
                rows = (
                    await conn.execute(
                        sa.select(resources).where(resources.c.namespace == namespace)
                    )
                ).all()
                others = [
                    stored.resource
                    for stored in map(_row_to_stored, rows)
                    if stored.resource.key != (namespace, kind, name)
                ]
                found = referrers((kind, name), others)
                if found:
                    names = ", ".join(
                        f"{r.kind} {r.name!r} ({format_path(field)})" for r, field in found
                    )
                    raise ConflictError(
                        f"cannot delete {kind} {name!r} in namespace {namespace!r}: "
                        f"it is referenced by {names}"
                    )
                await conn.execute(resources.delete().where(_resource_key(namespace, kind, name)))

    # ----------------------------------------------------------------- runs

    async def create_run(self, record: RunRecord) -> None:
        with _db_errors(f"create run {record.id}"):
            async with self._writer.begin() as conn:
                await conn.execute(runs.insert().values(**_run_values(record)))

    async def save_run(self, record: RunRecord) -> None:
        values = _run_values(record)
        del values["id"]
        with _db_errors(f"save run {record.id}"):
            async with self._writer.begin() as conn:
                result = await conn.execute(
                    runs.update().where(runs.c.id == record.id).values(**values)
                )
                if result.rowcount == 0:
                    raise NotFoundError(f"run {record.id!r} not found")

    async def get_run(self, run_id: str) -> RunRecord | None:
        with _db_errors(f"read run {run_id}"):
            async with self._engine.connect() as conn:
                row = (await conn.execute(sa.select(runs).where(runs.c.id == run_id))).first()
        return _row_to_run(row) if row is not None else None

    async def list_runs(
        self, namespace: str, agent: str | None = None, limit: int = 50
    ) -> list[RunRecord]:
        query = sa.select(runs).where(runs.c.namespace == namespace)
        if agent is not None:
            query = query.where(runs.c.agent == agent)
        query = query.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        with _db_errors("list runs"):
            async with self._engine.connect() as conn:
                rows = (await conn.execute(query)).all()
        return [_row_to_run(row) for row in rows]

    # ----------------------------------------------------------------- events

    async def append_events(self, events: Sequence[Event]) -> None:
        if not events:
            return
        rows = [
            {"run_id": e.run_id, "seq": e.seq, "type": str(e.type), "ts": e.ts, "data": e.data}
            for e in events
        ]
        with _db_errors("append run events"):
            async with self._writer.begin() as conn:
                await conn.execute(run_events.insert(), rows)

    async def list_events(self, run_id: str, after_seq: int = 0) -> list[Event]:
        query = (
            sa.select(run_events)
            .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq)
            .order_by(run_events.c.seq)
        )
        with _db_errors("list run events"):
            async with self._engine.connect() as conn:
                rows = (await conn.execute(query)).all()
        return [
            Event(run_id=r.run_id, seq=r.seq, type=EventType(r.type), data=r.data, ts=r.ts)
            for r in rows
        ]


# --------------------------------------------------------------------------- errors


@contextmanager
def _db_errors(action: str) -> Iterator[None]:
    """Convert driver and SQLAlchemy exceptions into Corral errors, at the boundary."""
    try:
        yield
    except sa_exc.IntegrityError as exc:
        raise ConflictError(
            f"cannot {action}: it conflicts with stored state ({_cause(exc)})"
        ) from exc
    except sa_exc.SQLAlchemyError as exc:
        raise StoreError(f"cannot {action}: {_cause(exc)}") from exc
    except OSError as exc:
        raise StoreError(f"cannot {action}: {exc}") from exc


def _cause(exc: sa_exc.SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    lowered = text.lower()
    if "database is locked" in lowered or "database is busy" in lowered:
        return f"the database stayed locked by another writer past the busy timeout ({text})"
    if "disk is full" in lowered or "no space" in lowered:
        return f"the disk is full ({text})"
    if "unable to open database file" in lowered:
        return f"the database file cannot be opened ({text})"
    if "readonly" in lowered or "read-only" in lowered:
        return f"the database is read-only ({text})"
    return text


# --------------------------------------------------------------------------- SQLite setup


def _prepare_sqlite_path(url: sa.URL) -> None:
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _configure_sqlite(engine: AsyncEngine, busy_timeout_seconds: float) -> None:
    busy_ms = int(busy_timeout_seconds * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module: it would not begin before SELECTs or DDL.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    def on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine, "begin", on_begin)


def _current_revision(conn: sa.Connection) -> str | None:
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return None if revision is None else str(revision)


def _upgrade(conn: sa.Connection) -> None:
    if _current_revision(conn) == LATEST_REVISION:
        return
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["connection"] = conn
    try:
        command.upgrade(config, "head")
    except CommandError as exc:
        raise StoreError(
            f"cannot migrate the store: {exc} (was it created by a newer Corral?)"
        ) from exc


# --------------------------------------------------------------------------- rows


def _check_kinds(items: Sequence[Resource | LoadedResource]) -> None:
    problems = []
    for item in items:
        resource = resource_of(item)
        expected = SPEC_TYPES.get(resource.kind)
        if expected is None or not isinstance(resource.spec, expected):
            problems.append(
                (
                    locate(item, ("spec",)),
                    f"{resource.kind} {resource.name!r}: spec does not fit the kind",
                )
            )
    if problems:
        raise ResourceError(problems)


def _resource_key(namespace: str, kind: str, name: str) -> sa.ColumnElement[bool]:
    return sa.and_(
        resources.c.namespace == namespace, resources.c.kind == kind, resources.c.name == name
    )


async def _fetch_resource(
    conn: AsyncConnection, namespace: str, kind: str, name: str
) -> sa.Row[Any] | None:
    query = sa.select(resources).where(_resource_key(namespace, kind, name))
    return (await conn.execute(query)).first()


def _spec_json(spec: Spec) -> dict[str, Any]:
    return spec.model_dump(mode="json")


def _row_to_stored(row: sa.Row[Any]) -> StoredResource:
    spec_type = SPEC_TYPES.get(row.kind)
    if spec_type is None:
        raise ConfigurationError(f"stored resource {row.kind}/{row.name} has an unknown kind")
    try:
        spec = spec_type.model_validate(row.spec)
        metadata = Metadata(name=row.name, namespace=row.namespace, labels=row.labels)
    except ValidationError as exc:
        raise ConfigurationError(
            f"stored {row.kind} {row.name!r} in namespace {row.namespace!r} is no longer valid: {exc}"
        ) from exc
    resource = Resource(apiVersion=API_VERSION, kind=row.kind, metadata=metadata, spec=spec)
    return StoredResource(resource, row.generation, row.created_at, row.updated_at)


def _run_values(record: RunRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "namespace": record.namespace,
        "agent": record.agent,
        "state": record.state.value,
        "input": record.input,
        "output": dump(record.output),
        "error": record.error,
        "usage": dump(record.usage),
        "cost_usd": record.cost_usd,
        "steps": record.steps,
        "messages": dump(record.messages),
        "pending": dump(record.pending_approvals),
        "created_at": record.created_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
    }


def _row_to_run(row: sa.Row[Any]) -> RunRecord:
    return RunRecord(
        id=row.id,
        namespace=row.namespace,
        agent=row.agent,
        input=row.input,
        state=RunState(row.state),
        output=row.output,
        error=row.error,
        usage=load(Usage, row.usage),
        cost_usd=row.cost_usd,
        steps=row.steps,
        messages=load_messages(row.messages),
        pending_approvals=load(list[PendingApproval], row.pending),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )
