"""The reference in docs/ says what the code does: its links and paths exist, the README leads to every page
of it, and the selection policy's contract names what the job provides and reads."""

import re
from pathlib import Path

import duckdb
import pytest

from training_code.lib.selection_engine import DECISION_COLUMNS, NEAR_DUPLICATE_COLUMNS, provide_settings
from training_code.lib.selection_plan import SelectionPolicy
from zero_assets.core.settings import REPO_ROOT

DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")
README_MAX_LINES = 330
PATH = re.compile(r"`((?:training_code|zero_assets|docs|benchmarks|tests)/[\w/.]+\.(?:py|sql|md))`")


@pytest.mark.parametrize("page", [REPO_ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_links_and_paths_lead_somewhere(page: Path):
    text = page.read_text()
    links = [link for link in LINK.findall(text) if "://" not in link]
    paths = PATH.findall(text)
    assert links or paths, f"{page.name} names no file"
    missing = [link for link in links if not (page.parent / link).exists()]
    missing += [path for path in paths if not (REPO_ROOT / path).exists()]
    assert not missing, f"{page.name} names files that are not there: {missing}"


def test_the_readme_is_a_short_guide_that_links_every_docs_page():
    """The reference lives in docs/; the README stays a newcomer's guide that leads to every page of it."""
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "move reference material to a docs page"
    linked = {link for link in LINK.findall(text) if link.startswith("docs/")}
    assert {f"docs/{page.name}" for page in DOCS} <= linked, sorted({f"docs/{p.name}" for p in DOCS} - linked)


def test_the_policy_contract_names_what_the_job_provides_and_reads():
    text = (REPO_ROOT / "docs" / "selection.md").read_text()
    engine = duckdb.connect()
    provide_settings(engine, SelectionPolicy())
    provided = {row[0] for row in engine.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    variables = {row[0] for row in engine.execute("SELECT name FROM duckdb_variables()").fetchall()}
    assert provided and variables
    named = set(re.findall(r"`(\w+)`", text))
    assert provided | variables <= named, sorted((provided | variables) - named)
    for relation, columns in (("decisions", DECISION_COLUMNS), ("near_duplicates", NEAR_DUPLICATE_COLUMNS)):
        [row] = [line for line in text.splitlines() if line.startswith(f"| `{relation}` |")]
        assert all(f"`{column}`" in row for column in columns), (relation, row)
