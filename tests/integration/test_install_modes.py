"""The dashboard renders in every way of installing it: setuptools' default editable install
(``pip install -e .``), its strict editable install (what scripts/bootstrap uses) and the wheel.

The default editable install maps ``geneva_drive.dashboard`` onto ``app/`` through an import
hook, with ``templates/`` and ``static/`` beside it rather than inside it: the dashboard looked
for ``app/templates`` and every page was an empty reply.

Each mode gets a fresh venv outside the checkout, installed from a copy of the tracked files
(so neither the checkout nor its own ``build/__editable__`` link tree is touched). To stay
cheap, the venvs install the project alone (``--no-deps``) and see the dependencies through a
``.pth`` line naming the project venv's site-packages (only the dependencies are borrowed: the
project's own install there is a ``.pth`` of its own, which a ``.pth`` line does not run).
From a directory with no checkout, each renders the login page, a static file and the 404 page
of a standalone dashboard, and says where the package was imported from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(os.environ.get("GENEVA_TEST_DATABASE_URL")),
        reason="runs once, in the SQLite pass: the install does not depend on the database",
    ),
]

PROBE = r"""
import sys, tempfile, os
import geneva_drive.dashboard as dashboard
from geneva_drive.dashboard import create_app

where = tempfile.mkdtemp()
app = create_app({
    "SECRET_KEY": "a-key-long-enough-for-the-probe-0123",
    "SQLALCHEMY_DATABASE_URI": "sqlite:///" + os.path.join(where, "probe.sqlite3"),
    "USERS": {},
})
client = app.test_client()
login = client.get("/login")
assert login.status_code == 200 and b'name="password"' in login.data, login.status_code
css = client.get("/static/css/app.css")
assert css.status_code == 200 and len(css.data) > 100, css.status_code
css.close()
missing = client.get("/no-such-page")
assert missing.status_code == 404 and b"Not Found" in missing.data, missing.status_code
print("RENDERED", dashboard.__file__)
"""


def _source_copy(where: Path) -> Path:
    """The checkout's tracked files (what a clone holds), without .venv, build/ or caches."""
    copy = where / "src"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if not name or not (ROOT / name).is_file():
                continue
            target = copy / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    else:
        shutil.copytree(
            ROOT,
            copy,
            ignore=shutil.ignore_patterns(
                ".venv", "build", ".git", "__pycache__", "var", "*.egg-info"
            ),
        )
    return copy


def _venv(where: Path) -> Path:
    """A venv without pip that sees the project venv's dependencies (not the project)."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "project-deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


def _pip(python: Path, *args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"pip install {args}:\n{done.stdout}\n{done.stderr}"


def _probe(python: Path, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "PATH")}
    done = subprocess.run(
        [str(python), "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RENDERED ")]
    return line.removeprefix("RENDERED ")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    here = tmp_path / "elsewhere"
    here.mkdir()
    return here


def test_the_default_editable_install_renders(tmp_path: Path, outside: Path) -> None:
    source = _source_copy(tmp_path)
    python = _venv(tmp_path)
    _pip(python, "-e", str(source), cwd=tmp_path)
    imported = _probe(python, outside)
    # The lenient mode imports straight from the repository's layout: app/ is the package.
    assert Path(imported).parent == source / "app", imported


def test_the_strict_editable_install_renders(tmp_path: Path, outside: Path) -> None:
    source = _source_copy(tmp_path)
    python = _venv(tmp_path)
    _pip(python, "-e", str(source), "--config-settings", "editable_mode=strict", cwd=tmp_path)
    imported = _probe(python, outside)
    assert "__editable__" in imported and str(source) in imported, imported


def test_the_wheel_renders(tmp_path: Path, outside: Path) -> None:
    source = _source_copy(tmp_path)
    python = _venv(tmp_path)
    _pip(python, str(source), cwd=tmp_path)
    imported = _probe(python, outside)
    assert "site-packages" in imported and str(source) not in imported, imported
