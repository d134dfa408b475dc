"""The site's shape: the CLI reference covers every command, every page is in the nav, links hold."""

from __future__ import annotations

import importlib.util
import re

from tests.docs._runner import REPO

_spec = importlib.util.spec_from_file_location(
    "cli_reference", REPO / "docs" / "_hooks" / "cli_reference.py"
)
assert _spec is not None and _spec.loader is not None
cli_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_reference)

MKDOCS = (REPO / "mkdocs.yml").read_text()


def test_the_cli_page_renders_a_section_with_the_help_of_every_command() -> None:
    """Each runnable command has help text and its own section holding its whole --help."""
    rendered = cli_reference.render()
    names = [name for name, _, _ in cli_reference.commands()]
    assert {"demo", "inspect", "keys new", "trust add", "mcp"} <= set(names)
    for name, parser, helptext in cli_reference.commands():
        assert helptext, f"tether {name} has no help"
        assert f"## `tether {name}`" in rendered
        assert parser.format_usage().split()[1] in rendered  # its usage line is on the page


def test_the_cli_page_is_rendered_by_the_hook_mkdocs_runs() -> None:
    """mkdocs.yml registers the hook and the CLI page holds the marker it replaces."""
    assert "docs/_hooks/cli_reference.py" in MKDOCS
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert cli_reference.MARKER in page
    assert cli_reference.on_page_markdown(page, None, None, None).count("## `tether ") > 15


def test_every_page_is_in_the_nav() -> None:
    """A page left out of mkdocs.yml's nav would be built but never reachable from the menu."""
    listed = set(re.findall(r"(\S+\.md)\s*$", MKDOCS, re.MULTILINE))
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert pages == listed


def test_the_readme_links_to_pages_that_exist() -> None:
    """Every relative link of the README names a file of the repository."""
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert links
    for link in links:
        assert (REPO / link).exists(), link
