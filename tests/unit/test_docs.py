"""The pages a person reads first: the README fits a first day, every table renders, no page
links to itself, and what an example writes into the checkout is git-ignored."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def test_the_readme_is_at_most_8_kb() -> None:
    assert (REPO / "README.md").stat().st_size <= 8 * 1024


def _tables(text: str) -> list[list[str]]:
    """Each run of lines that start with ``|``, outside fenced blocks."""
    tables: list[list[str]] = []
    fenced, previous = False, False
    for line in text.splitlines():
        fenced ^= line.strip().startswith("```")
        row = not fenced and line.startswith("|")
        if row and not previous:
            tables.append([])
        if row:
            tables[-1].append(line)
        previous = row
    return tables


def test_every_table_has_a_header_row_and_a_separator_under_it() -> None:
    for page in PAGES:
        for table in _tables(page.read_text()):
            where = f"{page.name}: {table[0][:60]}"
            assert not SEPARATOR.match(table[0]), f"{where}: no header row"
            assert len(table) > 1 and SEPARATOR.match(table[1]), f"{where}: no separator"


def test_no_page_links_to_itself() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).resolve() != page.resolve(), (page.name, target)


def test_files_the_examples_write_in_the_checkout_are_ignored() -> None:
    written = {
        path
        for page in [*PAGES, REPO / "pipelines" / "README.md", REPO / "components" / "README.md"]
        for block in re.findall(r"```(?:bash|sh)[^\n]*\n(.*?)```", page.read_text(), re.S)
        for path in re.findall(r"(?<![>&\d])>\s*([\w./-]+)", block)
        if not path.startswith("/")
    }
    assert written, "no example writes a file: this test checks nothing"
    for path in sorted(written):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert ignored.returncode == 0, f"{path} is written by an example and not git-ignored"
