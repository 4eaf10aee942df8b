"""SQLAlchemy's private API is called from ``geneva_drive.sqla_internals`` only
(docs/ARCHITECTURE.md, "Databases"): an SQLAlchemy upgrade that changes one of those names
then breaks one module, whose contracts tests/engine/test_persistence.py and
tests/engine/test_compiled.py pin.

The check reads the source of the engine and the dashboard: any attribute whose name starts
with one underscore and that SQLAlchemy's session, state, mapper, identity map, connection,
compiler or type objects have, and a ``_``-prefixed keyword given to one of their methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlalchemy import Connection, Integer
from sqlalchemy.engine import Engine
from sqlalchemy.orm import InstanceState, Mapper, Session
from sqlalchemy.sql.compiler import SQLCompiler

ROOT = Path(__file__).resolve().parents[2]
SEAM = ROOT / "engine" / "sqla_internals.py"

pytestmark = pytest.mark.sqlite_pass

#: The session's identity map class (a private class name: taken from an instance).
IdentityMapClass = type(Session().identity_map)

_SQLALCHEMY_CLASSES = (
    Session,
    InstanceState,
    Mapper,
    IdentityMapClass,
    Connection,
    Engine,
    SQLCompiler,
    Integer,
)
#: Private names SQLAlchemy puts on mapped instances (not on any class above).
_ON_INSTANCES = {"_sa_instance_state", "_sa_class_manager"}


def _is_sqlalchemy_private(name: str) -> bool:
    if not name.startswith("_") or name.startswith("__"):
        return False
    return name in _ON_INSTANCES or any(hasattr(cls, name) for cls in _SQLALCHEMY_CLASSES)


def _uses(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and _is_sqlalchemy_private(node.attr):
            # self._x / cls._x are the module's own attributes, whatever SQLAlchemy names.
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and any(hasattr(cls, node.func.attr) for cls in _SQLALCHEMY_CLASSES)
        ):
            # A private keyword of an SQLAlchemy method (``construct_params(_check=False)``).
            for keyword in node.keywords:
                if keyword.arg and keyword.arg.startswith("_"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {keyword.arg}=")
    return found


def test_only_the_seam_calls_sqlalchemys_private_api():
    files = sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "app").rglob("*.py"))
    uses = [use for path in files if path != SEAM for use in _uses(path)]
    assert uses == [], f"private SQLAlchemy API outside engine/sqla_internals.py: {uses}"


def test_the_check_sees_each_kind_of_use(tmp_path):
    sample = tmp_path / "engine" / "sample.py"
    sample.parent.mkdir()
    sample.write_text(
        "state._commit_all(d, m)\n"
        "connection._cursor_execute(c, s, p)\n"
        "obj._sa_instance_state\n"
        "compiled.construct_params(_check=False)\n"
        "self._commit_all = 1\n"
        "thing._not_sqlalchemys\n"
        "Workflow.create(hero, _metadata={})\n"
    )
    found = sorted(use.split(" ", 1)[1] for use in _uses(sample, root=tmp_path))
    assert found == ["._commit_all", "._cursor_execute", "._sa_instance_state", "_check="]


def test_the_seam_still_uses_what_it_wraps():
    """Each wrapped private name still exists in the installed SQLAlchemy."""
    assert callable(InstanceState._commit_all)
    assert callable(Session._register_altered) and callable(Session._register_persistent)
    assert callable(Mapper._check_configure)
    assert callable(IdentityMapClass._add_unpresent)
    assert callable(Connection._cursor_execute)
    assert callable(Integer()._cached_result_processor)
