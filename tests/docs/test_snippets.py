"""Every code block of the README and the docs site runs, so a page cannot drift from the API.

A page runs top to bottom in a fresh directory (also ``$HOME``); what a page
needs beyond that (a ticket service, a PostgreSQL database) is a fixture
named in :data:`FIXTURES` and said in the page's own prose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import unittest
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.docs._runner import LANGUAGES, REPO, fences, pages, sybil


@contextmanager
def tickets(tmp_path: Path) -> Iterator[None]:
    """The reference ticket service on loopback; its URL in ``$TICKETS_URL``."""
    from tests.integration._services import effects_service

    with effects_service(tmp_path) as service:
        os.environ["TICKETS_URL"] = service.url
        yield


@contextmanager
def mail(tmp_path: Path) -> Iterator[None]:
    """The reference mail server on loopback; its port in ``$MAIL_PORT``, its Maildir in ``$MAILDIR``."""
    maildir = tmp_path / "mail"
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.testing.mail_server", "--maildir", str(maildir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        os.environ["MAIL_PORT"] = str(json.loads(process.stdout.readline())["port"])
        os.environ["MAILDIR"] = str(maildir)
        yield
    finally:
        process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def postgres(tmp_path: Path) -> Iterator[None]:
    """A fresh schema in the test PostgreSQL database; its URL in ``$DB``."""
    from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        os.environ["DB"] = url_in_schema(dsn, schema)
        yield


#: What a page needs that it says in prose and does not start itself.
FIXTURES: dict[str, tuple[Callable[[Path], AbstractContextManager[None]], ...]] = {
    "docs/how-to/own-function.md": (tickets,),
    "docs/how-to/own-loop.md": (tickets, mail),
    "docs/how-to/compensation.md": (tickets,),
    "docs/how-to/pydantic-ai.md": (tickets, mail),
    "docs/how-to/http-and-email.md": (tickets, mail),
    "docs/how-to/langgraph.md": (tickets,),
    "docs/how-to/workers.md": (postgres,),
}


def _id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", pages(), ids=_id)
def test_every_code_block_names_a_known_language(page: Path) -> None:
    """Each fence names python, sh, json or text, and starts a line (never inside a list)."""
    for line, indent, lang in fences(page.read_text()):
        assert lang in LANGUAGES, f"{_id(page)}:{line}: fence language {lang!r}"
        assert not indent, f"{_id(page)}:{line}: an indented fence is not run; unindent it"


@pytest.mark.parametrize("page", pages(), ids=_id)
def test_no_page_has_an_indented_code_block(page: Path) -> None:
    """Code is fenced, never indented by four spaces outside a list (an indented block is not run)."""
    lines = page.read_text().splitlines()
    inside = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            inside = not inside
        if inside or not line.startswith("    ") or number < 2 or lines[number - 2].strip():
            continue
        before = next((b for b in reversed(lines[: number - 2]) if b.strip()), "")
        in_list = before.startswith(("- ", "* ", "  ")) or before.split(".")[0].isdigit()
        assert in_list, f"{_id(page)}:{number}: an indented code block; fence it"


@pytest.mark.parametrize("page", pages(), ids=_id)
def test_every_skipped_block_says_why(page: Path) -> None:
    """A block marked not-run carries its reason in the marker."""
    for marker in re.findall(r"<!--\s*skip:(.*?)-->", page.read_text(), re.DOTALL):
        assert re.fullmatch(r'\s*next\s+"[^"]{10,}"\s*', marker), f"{_id(page)}: skip:{marker}"


@pytest.mark.skipif(
    sys.flags.optimize > 0,
    reason="the pages ran in the first pass; under -O only the runtime's own tests repeat",
)
@pytest.mark.parametrize("page", pages(), ids=_id)
def test_the_page_runs_as_written(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every python, sh and json block of the page runs, in order, and none fails."""
    environ = dict(os.environ)
    home, services = tmp_path / "home", tmp_path / "services"
    home.mkdir()
    services.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("HOME", str(home))
    for name in ("TETHER_KEYRING_FILE", "TETHER_KEYRING", "TETHER_DEMO_HOME"):
        monkeypatch.delenv(name, raising=False)
    chain = continued(page)
    namespace: dict[str, object] = {}
    ran = 0
    try:
        with ExitStack() as stack:
            for fixture in FIXTURES.get(_id(chain[0]), ()):
                stack.enter_context(fixture(services))
            for part in chain:
                document = sybil().parse(part)
                document.namespace = namespace  # the pages before it left their names here
                for example in document:
                    try:
                        example.evaluate()
                    except unittest.SkipTest:
                        continue
                    ran += part == page
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert ran or not list(fences(page.read_text())) or _only_text(page)


def continued(page: Path) -> list[Path]:
    """The pages a page continues (``<!-- docs-test: continues PATH -->``), then the page."""
    found = re.search(r"<!-- docs-test: continues (\S+) -->", page.read_text())
    if found is None:
        return [page]
    return [*continued(REPO / "docs" / found[1]), page]


def _only_text(page: Path) -> bool:
    return all(lang == "text" for _, _, lang in fences(page.read_text()))
