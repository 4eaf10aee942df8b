"""The dashboard's template environment: compiled templates shared by the apps of a process.

Each dashboard app has its own Jinja environment (the host app's own templates stay apart),
yet compiling the overview's templates cost 84 of a new app's first 240 ms. The
compiled code is kept per set of Jinja options and checked against the source's checksum.
"""

from __future__ import annotations

from typing import Any

import jinja2

from geneva_drive.dashboard import rendering
from geneva_drive.dashboard.rendering import CompiledTemplates


class CountingEnvironment(jinja2.Environment):
    """A real Jinja environment that counts the templates it compiles from source."""

    compiled: list[str]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.compiled = []

    def compile(self, source: Any, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        self.compiled.append(str(name))
        return super().compile(source, name, *args, **kwargs)


def test_a_second_environment_reuses_the_compiled_template_and_an_edit_compiles_again():
    cache = CompiledTemplates()
    sources = {"page.html": "Hello {{ who }}"}
    first = CountingEnvironment(loader=jinja2.DictLoader(sources), bytecode_cache=cache)
    assert first.get_template("page.html").render(who="olga") == "Hello olga"
    assert first.compiled == ["page.html"]

    second = CountingEnvironment(loader=jinja2.DictLoader(sources), bytecode_cache=cache)
    assert second.get_template("page.html").render(who="vic") == "Hello vic"
    assert second.compiled == []  # the code the first one compiled

    sources["page.html"] = "Goodbye {{ who }}"  # an edited template: never served stale
    third = CountingEnvironment(loader=jinja2.DictLoader(sources), bytecode_cache=cache)
    assert third.get_template("page.html").render(who="vic") == "Goodbye vic"
    assert third.compiled == ["page.html"]


def test_dashboard_apps_of_one_process_share_compiled_templates_per_set_of_options(
    app_factory,
):
    first, second = app_factory(), app_factory()
    cache = rendering.environment(first).bytecode_cache
    assert isinstance(cache, CompiledTemplates)
    assert rendering.environment(second).bytecode_cache is cache
    assert rendering.environment(first) is not rendering.environment(second)

    # Other options shape other code: an app with ``trim_blocks`` has a cache of its own.
    other = app_factory()
    other.jinja_options = {**other.jinja_options, "trim_blocks": True}
    assert rendering.environment(other).bytecode_cache is not cache

    # A host that brings its own bytecode cache keeps it.
    own = jinja2.FileSystemBytecodeCache()
    hosted = app_factory()
    hosted.jinja_options = {**hosted.jinja_options, "bytecode_cache": own}
    assert rendering.environment(hosted).bytecode_cache is own


def test_a_page_renders_the_same_from_shared_compiled_templates(app_factory):
    """The second app's pages come from the first one's compiled code and render alike."""
    from tests.app.conftest import login

    pages = []
    for _ in range(2):
        client = login(app_factory().test_client(), "olga")
        response = client.get("/definitions")
        assert response.status_code == 200
        pages.append(response.get_data(as_text=True))
    assert pages[0] == pages[1]
    assert "DashPayment" in pages[0]
