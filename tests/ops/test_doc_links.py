"""README.md's links into docs/ (and the other files it names) lead to files that exist.
The site's own links are checked by its build (tools/docs/build.sh, warnings as
errors); README is read on GitHub and PyPI, outside that build."""

from __future__ import annotations

import re
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_readme_links_lead_to_files_that_exist() -> None:
    readme = (CHECKOUT / "README.md").read_text(encoding="utf-8")
    targets = [t for t, _ in LINK.findall(readme) if "://" not in t]
    assert targets, "README links to no page"
    assert [t for t in targets if not (CHECKOUT / t).is_file()] == []


def test_every_docs_page_is_in_the_site_index() -> None:
    # The site build refuses a page missing from every toctree; this says so in the
    # test run too, which does not build the site.
    index = (CHECKOUT / "docs" / "index.md").read_text(encoding="utf-8")
    for page in (CHECKOUT / "docs").rglob("*.md"):
        name = str(page.relative_to(CHECKOUT / "docs").with_suffix(""))
        assert name == "index" or name in index, name
