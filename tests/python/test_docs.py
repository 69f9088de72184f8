"""The README and docs/ stay true: every link resolves, every JSON and TOML snippet a user
would paste parses, every `make` target they name exists, and every flag the configuration
page lists is one `--help` knows (and the other way round)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _fences(lang: str) -> list[tuple[Path, str]]:
    return [(page, body) for page in PAGES for tag, body in FENCE.findall(page.read_text()) if tag == lang]


def test_readme_is_a_newcomers_page():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page: Path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, f"docs/{page.name} is not linked from README.md"


@pytest.mark.parametrize("lang, parse", [("json", json.loads), ("toml", tomllib.loads)])
def test_snippets_parse(lang, parse):
    found = _fences(lang)
    assert found, f"no {lang} snippet found: the fence pattern no longer matches the pages"
    for page, body in found:
        try:
            parse(body)
        except ValueError as exc:
            pytest.fail(f"a {lang} snippet in {page.name} does not parse ({exc}):\n{body}")


def test_make_targets_exist():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    for page in PAGES:
        for target in re.findall(r"`make ([a-z][\w-]*)", page.read_text()):
            assert target in targets, f"{page.name} names `make {target}`, which the Makefile does not have"


def test_configuration_page_lists_every_flag():
    help_text = subprocess.run(
        [sys.executable, "-m", "wisp_shim", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    known = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", help_text)) - {"--help"}
    documented = set(re.findall(r"^\| `(--[a-z][a-z0-9-]+)", (REPO / "docs" / "configuration.md").read_text(), re.M))
    assert known, "no flag found in --help: the pattern no longer matches its format"
    assert documented - known == set(), f"docs/configuration.md lists flags --help does not know: {documented - known}"
    assert known - documented == set(), f"flags --help knows that docs/configuration.md does not list: {known - documented}"
