"""The manual, shipped inside the wheel: a reader of the package's README (PyPI, ``pip show``),
where the README's relative links do not resolve, finds it at :data:`MANUAL`."""

from __future__ import annotations

from pathlib import Path

#: The manual as installed (``geneva_drive/docs/MANUAL.md``), or in the source tree.
MANUAL = Path(__file__).parent / "MANUAL.md"
#: The Prometheus alert rules the manual's metrics chapter describes.
PROMETHEUS_RULES = Path(__file__).parent / "prometheus-rules.yml"
