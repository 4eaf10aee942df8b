"""The dialect seam: no code outside ``engine/dialects/`` branches on a database's name.

Everything that differs between SQLite, PostgreSQL and MariaDB/MySQL is asked of the dialect
object (``geneva_drive.dialects.dialect_for``); adding a database is adding a module there
(CONTRIBUTING.md, "Adding a database"). A branch on the name elsewhere would have to be found
and changed again for every new backend, so the suite refuses one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

from geneva_drive import dialects
from geneva_drive.dialects.base import Dialect
from geneva_drive.errors import ConfigurationError

pytestmark = pytest.mark.sqlite_pass  # reads source files and SQLAlchemy dialects, no database

ROOT = Path(__file__).resolve().parents[1]
#: The names of the old branches (``db.is_sqlite``, ``db.is_mysql_family``, ``is_mysql_url``)
#: and any test of a SQLAlchemy dialect's name: none may remain outside the dialect modules.
BRANCH = re.compile(r"is_sqlite|is_mysql|dialect.name")
#: Where a database's name may be read: the dialect modules themselves. (Migrations, which
#: replay history per backend, live outside engine/ and app/.)
ALLOWED = ROOT / "engine" / "dialects"


def branches_outside_the_seam() -> list[str]:
    found = []
    for folder in ("engine", "app"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ALLOWED in path.parents:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if BRANCH.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_backend_branch_outside_the_dialect_modules() -> None:
    found = branches_outside_the_seam()
    assert not found, (
        "a branch on the database's name outside engine/dialects/; ask the dialect object "
        "instead (geneva_drive.dialects.dialect_for(session).<capability or method>, "
        "adding one to engine/dialects/base.py and each backend module if needed):\n"
        + "\n".join(found)
    )


def test_the_check_finds_a_branch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check itself must be able to fail: a stray branch in a copy of the tree is found.
    engine = tmp_path / "engine"
    (engine / "dialects").mkdir(parents=True)
    (tmp_path / "app").mkdir()
    (engine / "dialects" / "sqlite.py").write_text('if dialect.name == "sqlite": pass\n')
    (engine / "stray.py").write_text('if session.get_bind().dialect.name == "sqlite":\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "ALLOWED", engine / "dialects")
    assert branches_outside_the_seam() == [
        'engine/stray.py:1: if session.get_bind().dialect.name == "sqlite":'
    ]


@pytest.mark.parametrize(
    ("sqlalchemy_dialect", "module"),
    [
        (sqlite.dialect(), dialects.sqlite),
        (postgresql.psycopg.dialect(), dialects.postgresql),
        (mysql.pymysql.dialect(), dialects.mysql),
    ],
)
def test_each_backend_has_its_module(sqlalchemy_dialect: object, module: object) -> None:
    found = dialects.dialect_for(sqlalchemy_dialect)
    assert found is module.DIALECT  # type: ignore[attr-defined]
    assert isinstance(found, Dialect)


def test_a_url_names_its_dialect_and_mariadb_urls_are_mysqls() -> None:
    assert dialects.dialect_for_url("sqlite:///x.db") is dialects.sqlite.DIALECT
    assert dialects.dialect_for_url("postgresql+psycopg://h/db") is dialects.postgresql.DIALECT
    assert dialects.dialect_for_url("mysql+pymysql://h/db") is dialects.mysql.DIALECT
    assert dialects.dialect_for_url("mariadb+pymysql://h/db") is dialects.mysql.DIALECT


def test_an_unsupported_database_is_refused_with_the_setting_to_change() -> None:
    with pytest.raises(ConfigurationError, match=r"'oracle'.*GENEVA_DATABASE_URL"):
        dialects.dialect_for_url("oracle://h/db")


def test_every_backend_implements_the_statements_that_differ() -> None:
    # The base class has no portable epoch expression: each module must give its own.
    for module in (dialects.sqlite, dialects.postgresql, dialects.mysql):
        cls = type(module.DIALECT)
        assert cls.epoch_seconds is not Dialect.epoch_seconds, cls.__name__


def test_an_adopted_postgresql_engine_counts_a_closed_socket_as_a_lost_connection() -> None:
    """A host's engine (``GenevaDrive.init_app(db=…)``) gets the hook the engine's own gets
    (tests/engine/test_pool_liveness.py raises the error under finalize)."""
    from sqlalchemy import create_engine, event

    from geneva_drive.dialects.postgresql import _socket_closed_is_a_disconnect

    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connects
    dialect = dialects.dialect_for(engine)
    dialect.adopt(engine)
    dialect.adopt(engine)  # adopting again adds nothing (install asks event.contains first)
    assert event.contains(engine, "handle_error", _socket_closed_is_a_disconnect)
    engine.dispose()
