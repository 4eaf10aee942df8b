"""Runs every Python example of docs/MANUAL.md, so the manual cannot drift from the code.

The convention (also described at the top of the manual's source):

- A fenced ```` ```python ```` block preceded by ``<!-- test: NAME -->`` is an example. Blocks
  that share a NAME are joined in the order they appear and run as one test, so an example
  may be split by prose ("define the workflow", then "drive it").
- ``<!-- test: shared -->`` blocks (the hero models used throughout) run once, when this
  module is imported, so their tables exist in every ``geneva_session`` database; their names
  are visible to every example.
- Each example runs against a real database through the ``geneva_session`` fixture (SQLite,
  or PostgreSQL when ``GENEVA_TEST_DATABASE_URL`` says so), with ``session`` bound to that
  fixture's session. Steps run through the real executor via ``geneva_drive.testing``.
- Every ```` ```python ```` block must carry a marker: an unmarked one fails
  ``test_every_python_block_is_executed``.

Tracebacks point at the manual: each block is compiled with its line numbers in MANUAL.md.
Workflow classes an example defines are unregistered afterwards, so the examples cannot
shadow workflow classes of other tests that happen to share a name.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from geneva_drive import registry as registry_module
from geneva_drive.workflow import Workflow

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "MANUAL.md"
MARKER = re.compile(r"^<!--\s*test:\s*([A-Za-z0-9_.-]+)\s*-->\s*$")
FENCE_OPEN = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    line: int  # 1-based line of the first code line in MANUAL.md
    code: str
    language: str
    name: str | None


@dataclass
class Example:
    name: str
    blocks: list[Block] = field(default_factory=list)


def parse(text: str) -> list[Block]:
    """Every fenced block of the manual, with the test marker that precedes it (if any)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    previous = ""
    i = 0
    while i < len(lines):
        opened = FENCE_OPEN.match(lines[i])
        if opened is None:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        language = opened.group(1)
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        marker = MARKER.match(previous)
        blocks.append(
            Block(
                line=start + 1,
                code="\n".join(lines[start:end]),
                language=language,
                name=marker.group(1) if marker else None,
            )
        )
        previous = ""
        i = end + 1
    return blocks


BLOCKS = parse(MANUAL.read_text(encoding="utf-8"))
EXAMPLES: dict[str, Example] = {}
for _block in BLOCKS:
    if _block.name is not None:
        EXAMPLES.setdefault(_block.name, Example(_block.name)).blocks.append(_block)
SHARED = EXAMPLES.pop("shared", Example("shared"))


def _run(block: Block, namespace: dict[str, Any]) -> None:
    # Padding with newlines makes tracebacks report the line number in MANUAL.md.
    source = "\n" * (block.line - 1) + block.code
    exec(compile(source, str(MANUAL), "exec"), namespace)


def _module_namespace(name: str) -> dict[str, Any]:
    """A real module's namespace (SQLAlchemy resolves ``Mapped[...]`` through sys.modules)."""
    module = types.ModuleType(name)
    module.__file__ = str(MANUAL)
    sys.modules[name] = module
    return module.__dict__


def _shared_namespace() -> dict[str, Any]:
    namespace = _module_namespace("manual_shared")
    for block in SHARED.blocks:
        _run(block, namespace)
    return namespace


SHARED_NAMESPACE = _shared_namespace()


@pytest.fixture
def isolated_registry():
    """Forget the workflow classes an example defines once it is over."""
    registry = dict(registry_module._workflows)
    polymorphic = dict(Workflow.__mapper__.polymorphic_map)
    try:
        yield
    finally:
        registry_module._workflows.clear()
        registry_module._workflows.update(registry)
        mapping = Workflow.__mapper__.polymorphic_map
        mapping.clear()
        mapping.update(polymorphic)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_manual_example(
    name, geneva_session, geneva_database, isolated_registry, generous_inline_time_budget, request
):
    # The inline budget's 200 ms can run out between two steps on a loaded machine and hand
    # the inline-successors example's chain to the broker; the examples show the path, not it.
    example = EXAMPLES[name]
    if name.startswith("tracing"):
        # Sets OpenTelemetry's global tracer provider as an application does: reset around it.
        request.getfixturevalue("otel_global")
    SHARED_NAMESPACE["outbox"].clear()
    module_name = f"manual_{name.replace('-', '_')}"
    namespace = _module_namespace(module_name)
    namespace.update({k: v for k, v in SHARED_NAMESPACE.items() if not k.startswith("__")})
    namespace["session"] = geneva_session
    namespace["geneva_database"] = geneva_database  # as a host's own pytest fixture has it
    try:
        for block in example.blocks:
            _run(block, namespace)
    finally:
        sys.modules.pop(module_name, None)


def test_every_python_block_is_executed():
    unmarked = [b.line for b in BLOCKS if b.language == "python" and b.name is None]
    assert unmarked == [], (
        f"MANUAL.md has python blocks without a <!-- test: NAME --> marker at lines {unmarked}; "
        "mark them so the suite runs them"
    )


def test_the_manual_has_examples():
    python_blocks = [b for b in BLOCKS if b.language == "python"]
    assert len(python_blocks) >= 40
    assert len(EXAMPLES) >= 25


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    anchors: set[str] = set()
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence and (heading := re.match(r"^#{1,6} (.+)$", line)):
            anchors.add(_slug(heading.group(1)))
    return anchors


def test_links_in_the_manual_resolve():
    text = MANUAL.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    own = _anchors(text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in own:
                broken.append(target)
            continue
        linked = (MANUAL.parent / path).resolve()
        missing_heading = (
            linked.is_file()
            and bool(anchor)
            and anchor not in _anchors(linked.read_text(encoding="utf-8"))
        )
        if not linked.exists() or missing_heading:
            broken.append(target)
    assert broken == [], f"MANUAL.md links to missing files or headings: {broken}"
