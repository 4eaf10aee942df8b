"""Every use of SQLAlchemy's private API, in one place.

The fast path (``persistence``: rows written by Core with the ORM objects kept in sync, and
``compiled``: the hot statements run on the driver's cursor) does per row what SQLAlchemy's
own loader and flush do, at a fraction of their cost (bench/RESULTS.md, B1 and B10). Doing
that takes a few of SQLAlchemy's private methods. They are called here and nowhere else, so
an SQLAlchemy upgrade that changes one of them breaks one module, and
``tests/engine/test_persistence.py`` and ``tests/engine/test_compiled.py`` pin each contract
(``tests/engine/test_sqlalchemy_private_api.py`` keeps every other module off private names).
docs/ARCHITECTURE.md ("Databases") says where this sits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.orm import InstanceState, Mapper, Session
from sqlalchemy.orm.identity import IdentityMap
from sqlalchemy.sql.compiler import SQLCompiler


def state_of(obj: Any) -> InstanceState[Any]:
    """The object's instance state (``inspect(obj)`` without the inspection registry's
    lookup: the before-flush hook asks for every dirty object)."""
    state: InstanceState[Any] = obj._sa_instance_state
    return state


def mark_clean(state: InstanceState[Any], identity_map: IdentityMap, dict_: Any = None) -> None:
    """The object's current values become its committed ones, as a flush or a load leaves
    them: no pending change, nothing to write."""
    state._commit_all(state.dict if dict_ is None else dict_, identity_map)


def expire_on_rollback(session: Session, states: Iterable[InstanceState[Any]]) -> None:
    """A rollback of this transaction (or its savepoint) expires these objects, as it does
    for what a flush wrote."""
    session._register_altered(list(states))


def register_inserted(session: Session, states: set[InstanceState[Any]]) -> None:
    """These objects were inserted in this transaction, as a flush registers them: a rollback
    expunges them again."""
    session._register_persistent(states)


def configure(mapper: Mapper[Any]) -> None:
    """Configure the mappers if an ORM query has not yet (a no-op once configured)."""
    mapper._check_configure()


def add_to_identity_map(
    identity_map: IdentityMap, state: InstanceState[Any], identity: Any
) -> None:
    """Put a state built by hand into the identity map, as the ORM's row loader does."""
    identity_map._add_unpresent(state, identity)


def cursor_execute(connection: Connection, cursor: Any, sql: str, parameters: Any) -> None:
    """Run on the driver's cursor through SQLAlchemy's own hook: cursor-execute events, echo,
    exception wrapping and invalidation of a dead connection all still happen."""
    connection._cursor_execute(cursor, sql, parameters)


def bind_processors(compiled: SQLCompiler) -> Mapping[str, Any]:
    """Each bind parameter's type processor (a callable, or None)."""
    processors: Mapping[str, Any] = compiled._bind_processors
    return processors


def result_processors(
    compiled: SQLCompiler, dialect: Dialect
) -> tuple[Callable[[Any], Any] | None, ...]:
    """Each result column's type processor for this dialect (None: the value as the driver
    returns it)."""
    return tuple(
        entry.type._cached_result_processor(dialect, None) for entry in compiled._result_columns
    )


def bound_defaults(compiled: SQLCompiler) -> dict[str, Any]:
    """The values a statement binds itself, without demanding the required ones."""
    return dict(compiled.construct_params(_check=False))


__all__ = [
    "add_to_identity_map",
    "bind_processors",
    "bound_defaults",
    "configure",
    "cursor_execute",
    "expire_on_rollback",
    "mark_clean",
    "register_inserted",
    "result_processors",
    "state_of",
]
