"""Where the dashboard's templates and static files are, in every install mode.

They are packages of their own (``geneva_drive.dashboard.templates`` and ``.static``), laid
out differently by each way of installing:

- the wheel and setuptools' *strict* editable install put them beside this package
  (``geneva_drive/dashboard/templates``; the strict install as a tree of links);
- setuptools' default (*lenient*) editable install, ``pip install -e .``, maps the package
  names onto the repository's directories through an import hook, so this package is
  ``app/`` and the templates are ``templates/`` beside it, not inside it; and that hook does
  not resolve data-only packages through ``importlib`` (``find_spec`` answers None).

So the import system is asked first, then the places the layouts above use, and the first
directory that exists wins. None found is an error naming what was tried, at start, never a
page that renders nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from geneva_drive.errors import UsageError

#: This package's directory (not resolve()d: in the strict editable install it is a tree of
#: links, and the data sits beside this package there as in the wheel).
HERE = Path(__file__).parent


def locate(name: str) -> Path:
    """The directory of the data package ``geneva_drive.dashboard.<name>``."""
    tried: list[Path] = []
    try:
        spec = importlib.util.find_spec(f"geneva_drive.dashboard.{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        tried.extend(Path(location) for location in spec.submodule_search_locations)
    tried.append(HERE / name)  # the wheel, the strict editable install
    tried.append(HERE.parent / name)  # the repository's layout: the lenient editable install
    for candidate in tried:
        if candidate.is_dir():
            return candidate
    raise UsageError(
        f"GenevaDrive's dashboard cannot find its {name} (looked in "
        f"{', '.join(str(path) for path in tried)}): reinstall geneva-drive "
        "(pip install geneva-drive, or pip install -e . in a checkout)"
    )
