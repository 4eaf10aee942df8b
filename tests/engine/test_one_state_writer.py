"""One writer: only ``transitions.py`` assigns a workflow's or an execution's state
(docs/ARCHITECTURE.md, "Layers"). Everything else asks ``states.py`` and calls a transition.

The check reads the source: an assignment to an attribute named ``state``, or ``state=`` in an
``UPDATE``'s ``.values(...)``, anywhere in the engine or the dashboard outside the state
writer. A signal's own states (``SignalState``) are a different machine and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "engine" / "transitions.py"

pytestmark = pytest.mark.sqlite_pass


def _sources() -> list[Path]:
    files = sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "app").rglob("*.py"))
    return [f for f in files if f != WRITER]


def _is_signal_state(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Name)
        and value.value.id == "SignalState"
    )


def _state_writes(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "state"
                    and not (node.value is not None and _is_signal_state(node.value))
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "values"
        ):
            for keyword in node.keywords:
                if keyword.arg == "state" and not _is_signal_state(keyword.value):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_only_the_transitions_module_writes_a_state():
    writes = [w for path in _sources() for w in _state_writes(path)]
    assert writes == [], f"states written outside engine/transitions.py: {writes}"


def test_the_check_finds_a_state_written_elsewhere(tmp_path):
    """The check itself: it sees both ways a state can be written."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "execution.state = 'completed'\n"
        "stmt = update(table).values(state='canceled')\n"
        "signal.state = SignalState.CONSUMED\n"
    )
    assert _state_writes(sample, root=tmp_path) == ["sample.py:1", "sample.py:2"]
