"""docs/ARCHITECTURE.md stays true to the tree: every file it names exists, and every engine
module is named in it (a new module gets its place in the layers and the concern table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()

pytestmark = pytest.mark.sqlite_pass


def _named_files() -> set[str]:
    return set(re.findall(r"`([\w/]+\.(?:py|html|md))`", DOC))


def _exists(name: str) -> bool:
    if (ROOT / name).exists():
        return True
    # A bare module name ("executor.py", "dialects/base.py") is the engine's.
    return (ROOT / "engine" / name).exists() or (ROOT / "app" / name).exists()


def test_every_file_the_architecture_names_exists():
    missing = sorted(n for n in _named_files() if "<" not in n and not _exists(n))
    assert missing == [], f"docs/ARCHITECTURE.md names files that do not exist: {missing}"


def test_every_engine_module_has_its_place_in_the_architecture():
    modules = sorted(p.stem for p in (ROOT / "engine").glob("*.py") if p.stem != "__init__")
    words = set(re.findall(r"`(\w+)(?:\.py)?`", DOC))
    unplaced = [m for m in modules if m not in words]
    assert unplaced == [], f"engine modules docs/ARCHITECTURE.md does not place: {unplaced}"
