"""The process's registries: workflow classes by ``workflow_name``, hero classes by name.

Their own module, below everything that looks a class up (operations, the Prometheus
collector, the dashboard's queries), so none of those needs ``geneva_drive.workflow`` - the DSL,
which itself calls operations - at import time. ``Workflow.__init_subclass__`` registers each
class here; a row whose ``type`` is not registered loads as plain ``Workflow``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import mapperlib

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow

_workflows: dict[str, type[Workflow]] = {}
_heroes: dict[str, type[Any]] = {}


# --- workflow classes --------------------------------------------------------------------------


def register_workflow(cls: type[Workflow]) -> None:
    """Record ``cls`` under its ``workflow_name`` (a redefinition replaces the old class)."""
    _workflows[cls.workflow_name] = cls


def forget_workflow(name: str) -> type[Workflow] | None:
    """Drop ``name`` from the registry; returns the class it named, if any."""
    return _workflows.pop(name, None)


def workflow_class(name: str) -> type[Workflow] | None:
    """The registered class of ``workflow_name`` ``name``, or None."""
    return _workflows.get(name)


def registered_workflows() -> dict[str, type[Workflow]]:
    """A copy of the registry: ``{workflow_name: class}``."""
    return dict(_workflows)


def is_registered(cls: type[Any]) -> bool:
    return _workflows.get(getattr(cls, "workflow_name", "")) is cls


# --- hero classes ------------------------------------------------------------------------------


def register_hero_class(cls: type[Any]) -> None:
    """Make ``hero_type`` values of ``cls`` loadable in processes that never created one."""
    _heroes[cls.__name__] = cls


def hero_class(hero_type: str) -> type[Any] | None:
    """The mapped class named ``hero_type``: registered, or found among SQLAlchemy's mappers."""
    cls = _heroes.get(hero_type)
    if cls is not None:
        return cls
    registries = list(getattr(mapperlib, "_mapper_registries", {}))
    for reg in registries:
        for mapper in list(reg.mappers):
            if mapper.class_.__name__ == hero_type:
                found: type[Any] = mapper.class_
                _heroes[hero_type] = found
                return found
    return None
