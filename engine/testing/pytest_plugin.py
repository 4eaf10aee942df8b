"""The ``geneva_session`` pytest fixture (registered through the ``pytest11`` entry point).

Each test gets an empty database holding every table of ``geneva_drive.models.Base.metadata`` (so a
test may map its own hero models on ``Base``): a new SQLite file in WAL mode by default, or a
fresh PostgreSQL schema when ``GENEVA_TEST_DATABASE_URL`` points at PostgreSQL, or a fresh
database (``gd_<random>``, dropped afterwards) when it points at MariaDB/MySQL
(``mysql+pymysql://root@127.0.0.1:3306/test``: the URL's own database is only connected to). The engine's
own session factory, executor, dispatcher and housekeeping are pointed at it, and messages
that would go to Celery are recorded (``geneva_transport``) instead of sent.

A host application's own tables come along when its conftest overrides ``geneva_metadata``::

    @pytest.fixture
    def geneva_metadata():
        return [db.metadata]          # the host's Flask-SQLAlchemy metadata

    @pytest.fixture
    def app(geneva_database):
        return create_app({"TESTING": True, **geneva_database.flask_config()})

``flask_config()`` points a Flask-SQLAlchemy app at the test database (on PostgreSQL, at the
test's schema), so a test can drive the host's webhook route and the workflow it wakes.
"""

from __future__ import annotations

import functools
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, event, text
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for_url
from geneva_drive.dialects.mysql import mysql_collation
from geneva_drive.models import Base


@dataclass
class TestDatabase:
    engine: Engine
    url: str
    schema: str | None
    #: The per-test database on MariaDB/MySQL (dropped by dispose()); None elsewhere. ``url``
    #: then names it, ``admin_url`` the database it was created from.
    database: str | None = None
    admin_url: str | None = None

    def flask_config(self) -> dict[str, Any]:
        """``SQLALCHEMY_DATABASE_URI`` (and engine options) for a Flask-SQLAlchemy app that
        should use this database."""
        config: dict[str, Any] = {"SQLALCHEMY_DATABASE_URI": self.url}
        if self.schema is not None:
            config["SQLALCHEMY_ENGINE_OPTIONS"] = {
                "connect_args": {"options": f"-csearch_path={self.schema}"}
            }
        return config

    def dispose(self) -> None:
        self.engine.dispose()
        if self.schema is not None:
            _drop_later(functools.partial(_drop_postgresql_schema, self.url, self.schema))
        if self.database is not None:
            _drop_later(
                functools.partial(drop_mysql_database, self.admin_url or self.url, self.database)
            )


def create_mysql_database(url: str, prefix: str = "gd") -> tuple[str, str]:
    """A new empty MariaDB/MySQL database next to ``url``'s: (its name, its URL)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        # The engine's tables name their collation themselves; the tests' hero tables take
        # the database's, the same binary NO PAD one (models.mysql_collation).
        collation = mysql_collation(connection.dialect)
        connection.execute(
            text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {collation}")
        )
    admin.dispose()
    return name, make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_mysql_database(url: str, name: str) -> None:
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    admin.dispose()


# Every test gets a database of its own, cloned from a template made once per session (per
# pytest-xdist worker) and per set of tables, instead of running ``create_all`` per test (its
# ~40 DDL statements, each a round trip and, on the servers, catalog work and log flushes):
#
# - SQLite: the template is a migrated file; a test's database is a copy of it.
# - PostgreSQL: the DDL ``create_all`` ran in the template schema is replayed in the test's
#   new schema in one round trip (``CREATE DATABASE … TEMPLATE`` measured slower: 1.5 s per
#   clone and drop against 0.4 s, since it copies every catalog of a database).
# - MariaDB/MySQL: the server's own ``SHOW CREATE TABLE`` of each template table is replayed,
#   one statement per table (create_all's one statement per index: 1.3 s per test measured).
#
# Keyed by the set of tables (the engine's, the tests' hero tables mapped on Base, a host's
# ``geneva_metadata``), so a test module that maps another table gets a template of its own.
TemplateKey = tuple[tuple[int, tuple[str, ...]], ...]

_sqlite_templates: dict[TemplateKey, Path] = {}
_template_directory: list[Path] = []
_pg_templates: dict[tuple[str, TemplateKey], str] = {}
_templates: dict[TemplateKey, tuple[str, list[str]]] = {}  # MariaDB: (template database, DDL)
_template_url: list[str] = []
_admin_engines: dict[str, Engine] = {}


def _all_metadata(metadata: Sequence[MetaData]) -> list[MetaData]:
    return [Base.metadata, *(extra for extra in metadata if extra is not Base.metadata)]


def _template_key(metadata: Sequence[MetaData]) -> TemplateKey:
    return tuple(
        (id(each), tuple(table.name for table in each.sorted_tables))
        for each in _all_metadata(metadata)
    )


def _admin_engine(url: str) -> Engine:
    """One engine per server URL for the per-test CREATE/DROP statements. Without a pool: each
    statement's connection is closed by the thread that used it (the test's, the one making the
    next database, the one dropping), so none is left open for the garbage collector."""
    engine = _admin_engines.get(url)
    if engine is None:
        engine = _admin_engines[url] = db.make_engine(url, poolclass=NullPool)
    return engine


def _sqlite_template(metadata: Sequence[MetaData]) -> Path:
    key = _template_key(metadata)
    found = _sqlite_templates.get(key)
    if found is None:
        if not _template_directory:
            _template_directory.append(Path(tempfile.mkdtemp(prefix="geneva-templates-")))
        found = _template_directory[0] / f"template-{len(_sqlite_templates)}.sqlite3"
        engine = db.make_engine(f"sqlite:///{found}", poolclass=NullPool)
        try:
            _create_all(engine, metadata)
        finally:
            # The last connection to close checkpoints the WAL into the file and removes it:
            # the file alone is the whole template (still in WAL mode, a header flag).
            engine.dispose()
        _sqlite_templates[key] = found
    return found


def _postgresql_ddl(url: str, metadata: Sequence[MetaData]) -> str:
    """The DDL ``create_all`` runs for these tables on this server, as one script."""
    key = (url, _template_key(metadata))
    found = _pg_templates.get(key)
    if found is None:
        schema = f"gd_tmpl_{uuid.uuid4().hex[:12]}"
        admin = _admin_engine(url)
        with admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        engine = db.make_engine(
            url, connect_args={"options": f"-csearch_path={schema}"}, poolclass=NullPool
        )
        statements: list[str] = []

        def record(
            _conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool
        ) -> None:
            if getattr(context, "isddl", False):  # not create_all's "does it exist?" queries
                statements.append(statement.strip())

        event.listen(engine, "before_cursor_execute", record)
        try:
            _create_all(engine, metadata)
        finally:
            engine.dispose()
            with admin.begin() as connection:
                connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        found = _pg_templates[key] = ";\n".join(statements)
    return found


def create_postgresql_test_schema(url: str, metadata: Sequence[MetaData] = ()) -> str:
    """A new schema next to ``url``'s holding the engine's (and ``metadata``'s) tables."""
    ddl = _postgresql_ddl(url, metadata)
    schema = f"gd_{uuid.uuid4().hex[:12]}"
    with _admin_engine(url).begin() as connection:
        connection.exec_driver_sql(
            f'CREATE SCHEMA "{schema}"; SET LOCAL search_path TO "{schema}";\n{ddl}'
        )
    return schema


def _drop_postgresql_schema(url: str, schema: str) -> None:
    with _admin_engine(url).begin() as connection:
        connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _mysql_schema(url: str, metadata: Sequence[MetaData] = ()) -> list[str]:
    key = _template_key(metadata)
    found = _templates.get(key)
    if found is None:
        name, template_url = create_mysql_database(url, prefix="gd_tmpl")
        engine = db.make_engine(template_url, poolclass=NullPool)
        tables = [table.name for each in _all_metadata(metadata) for table in each.sorted_tables]
        try:
            _create_all(engine, metadata)
            with engine.connect() as connection:
                ddl = [
                    str(connection.execute(text(f"SHOW CREATE TABLE `{table}`")).one()[1])
                    for table in tables
                ]
        finally:
            engine.dispose()
        found = _templates[key] = (name, ddl)
        _template_url[:] = [url]
    return found[1]


def create_mysql_test_database(url: str, metadata: Sequence[MetaData] = ()) -> tuple[str, str]:
    """A new MariaDB/MySQL database holding the engine's (and the tests') tables."""
    ddl = _mysql_schema(url, metadata)
    name = f"gd_{uuid.uuid4().hex[:12]}"
    admin = db.make_engine(url, poolclass=NullPool)
    try:
        with admin.begin() as connection:
            collation = mysql_collation(connection.dialect)
            connection.exec_driver_sql(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {collation}"
            )
            connection.exec_driver_sql(f"USE `{name}`")
            connection.exec_driver_sql("SET foreign_key_checks = 0")  # tables in any order
            for statement in ddl:
                connection.exec_driver_sql(statement)
    finally:
        admin.dispose()
    return name, make_url(url).set(database=name).render_as_string(hide_password=False)


# Dropping a test's database or schema (0.1-0.2 s of server DDL) overlaps the next test: one
# thread drops them in order; the session's end waits for it.
_drops: queue.Queue[Callable[[], None] | None] = queue.Queue()
_dropper: list[threading.Thread] = []


def _drop_in_background() -> None:
    while (drop := _drops.get()) is not None:
        try:
            drop()
        except Exception as error:  # reported, not raised: the test itself already ended
            print(f"geneva_drive.testing: could not drop a test database: {error}")


def _drop_later(drop: Callable[[], None]) -> None:
    if not _dropper:
        thread = threading.Thread(target=_drop_in_background, name="gd-drop", daemon=True)
        thread.start()
        _dropper.append(thread)
    _drops.put(drop)


# On the servers a test's database is made ahead, in a thread, while the test before it runs:
# the server's DDL (its file creation and log flushes, most of a clone's 0.4-1.3 s) overlaps the
# test instead of preceding it. One is made ahead per set of tables; the last is dropped at the
# session's end.
_ahead: dict[tuple[str, TemplateKey], tuple[Future[Any], Callable[[Any], None]]] = {}
_maker: list[ThreadPoolExecutor] = []


def _made_ahead(
    key: tuple[str, TemplateKey], make: Callable[[], Any], drop: Callable[[Any], None]
) -> Any:
    """What ``make()`` returns: the one made ahead for ``key`` if there is one (made now if it
    failed), and the next one is started."""
    pending = _ahead.pop(key, None)
    made = None
    if pending is not None:
        try:
            made = pending[0].result()
        except Exception:  # a server hiccup in the thread: make this one here, and see it fail
            made = None
    if made is None:
        made = make()
    if not _maker:
        _maker.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gd-ahead"))
    _ahead[key] = (_maker[0].submit(make), drop)
    return made


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the databases made ahead, finish the queued drops, then drop the templates."""
    for future, drop in _ahead.values():
        try:
            _drop_later(functools.partial(drop, future.result()))
        except Exception as error:
            print(f"geneva_drive.testing: a test database made ahead failed: {error}")
    _ahead.clear()
    if _maker:
        _maker.pop().shutdown(wait=True)
    if _dropper:
        _drops.put(None)
        _dropper.pop().join(timeout=120)
    for name, _ddl in _templates.values():
        drop_mysql_database(_template_url[0], name)
    _templates.clear()
    _pg_templates.clear()
    _sqlite_templates.clear()
    for engine in _admin_engines.values():
        engine.dispose()
    _admin_engines.clear()
    if _template_directory:
        shutil.rmtree(_template_directory.pop(), ignore_errors=True)


def create_test_database(directory: Path, metadata: Sequence[MetaData] = ()) -> TestDatabase:
    """An empty database with the engine's tables (and ``metadata``'s), per
    GENEVA_TEST_DATABASE_URL."""
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    key = (url or "", _template_key(metadata))
    isolation = dialect_for_url(url).test_isolation if url else "file"
    if url and isolation == "schema":
        _postgresql_ddl(url, metadata)  # the template, here rather than in the thread
        schema = _made_ahead(
            key,
            functools.partial(create_postgresql_test_schema, url, metadata),
            functools.partial(_drop_postgresql_schema, url),
        )
        engine = db.make_engine(
            url, connect_args={"options": f"-csearch_path={schema}"}, pool_size=10, max_overflow=20
        )
        return TestDatabase(engine, url, schema)
    if url and isolation == "database":
        _mysql_schema(url, metadata)  # the template, here rather than in the thread
        name, database_url = _made_ahead(
            key,
            functools.partial(create_mysql_test_database, url, metadata),
            lambda made: drop_mysql_database(url, made[0]),
        )
        engine = db.make_engine(database_url, pool_size=10, max_overflow=20)
        for extra in metadata:  # the template holds the engine's tables only
            if extra is not Base.metadata:
                extra.create_all(engine)
        return TestDatabase(engine, database_url, None, database=name, admin_url=url)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "geneva.sqlite3"
    shutil.copyfile(_sqlite_template(metadata), path)
    sqlite_url = f"sqlite:///{path}"
    return TestDatabase(db.make_engine(sqlite_url), sqlite_url, None)


def _create_all(engine: Engine, metadata: Sequence[MetaData]) -> None:
    for each in _all_metadata(metadata):
        each.create_all(engine)


@pytest.fixture
def geneva_metadata() -> list[MetaData]:
    """Extra metadata whose tables each test database gets: override it in a host's conftest
    to return the host's ``MetaData`` (one, or a list)."""
    return []


@pytest.fixture
def geneva_database(
    tmp_path: Path, geneva_metadata: MetaData | Sequence[MetaData]
) -> Iterator[TestDatabase]:
    extra = [geneva_metadata] if isinstance(geneva_metadata, MetaData) else list(geneva_metadata)
    database = create_test_database(tmp_path, extra)
    previous = db._engine
    db.configure(engine=database.engine)
    try:
        yield database
    finally:
        if previous is not None:
            db.configure(engine=previous)
        database.dispose()


@pytest.fixture
def geneva_transport() -> Iterator[transport.RecordingTransport]:
    recording = transport.RecordingTransport()
    previous = transport._transport
    transport.set_transport(recording)
    try:
        yield recording
    finally:
        transport.set_transport(previous)


@pytest.fixture
def geneva_session(
    geneva_database: TestDatabase, geneva_transport: transport.RecordingTransport
) -> Iterator[Session]:
    snapshot: dict[str, Any] = {k: v for k, v in vars(settings).items() if not k.startswith("_")}
    session = db.SessionFactory()
    db.set_current_session(session)
    try:
        yield session
    finally:
        db.set_current_session(None)
        session.rollback()
        session.close()
        for key, value in snapshot.items():
            setattr(settings, key, value)
