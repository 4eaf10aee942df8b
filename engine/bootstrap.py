"""Process start-up shared by every role: import the workflow modules, point at the database.

Web, workers and the dispatcher must all know the same workflow classes (docs/MANUAL.md, "Celery topology, the dispatcher, job options and priorities"): a worker
that has not imported a class would load its rows as plain ``Workflow`` and find no steps, so
the executor would pause them as "step not defined". ``GENEVA_WORKFLOW_MODULES`` lists the
modules (``pkg.mod,other.mod``); each role calls :func:`import_workflow_modules` before it
touches a workflow.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence

from geneva_drive.config import process_variable
from geneva_drive.errors import ConfigurationError

log = logging.getLogger(__name__)

_imported: set[str] = set()


def workflow_module_names(raw: str | Sequence[str] | None = None) -> list[str]:
    """The module names in ``raw`` (a list, or a string separated by commas or whitespace), or
    in ``GENEVA_WORKFLOW_MODULES`` when ``raw`` is None. The one parser of that setting."""
    value = process_variable("GENEVA_WORKFLOW_MODULES") if raw is None else raw
    parts = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    return [part.strip() for part in parts if part.strip()]


def ensure_cwd_importable() -> None:
    """Modules are found from the current directory, as ``python -m`` and ``celery -A`` do.

    One rule for every role: the CLI, the Celery main process and its prefork children (which
    may have been started with another ``sys.path[0]``) all resolve ``GENEVA_WORKFLOW_MODULES``
    the same way.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_workflow_modules(names: list[str] | None = None) -> list[str]:
    """Import every workflow module once; a missing module fails loudly, naming the variable."""
    wanted = workflow_module_names() if names is None else names
    if wanted:
        ensure_cwd_importable()
    for name in wanted:
        if name in _imported:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"GENEVA_WORKFLOW_MODULES names {name!r}, which cannot be imported: {exc}"
            ) from exc
        except Exception as exc:
            # A broken module (a misconfigured workflow class, a syntax or name error) is a
            # configuration problem of this deploy: callers refuse to start with this message
            # (check-deploy and doctor exit 2) rather than show a traceback.
            raise ConfigurationError(
                f"GENEVA_WORKFLOW_MODULES names {name!r}, which fails on import: "
                f"{type(exc).__name__}: {exc}. Fix the module, or remove it from the setting."
            ) from exc
        _imported.add(name)
        log.info("imported workflow module %s", name)
    return wanted
