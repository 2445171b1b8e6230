"""What a release is made of: one version, which the installed package's metadata
reads, and a changelog with a section for it (docs/getting-started/releases.md)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import celery_redlock

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_the_version_is_the_installed_distributions() -> None:
    # An editable install reads the version when installed: reinstall after a bump.
    assert celery_redlock.__version__ == version("celery-redlock")


def test_the_changelog_has_unreleased_first_then_a_section_for_the_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", CHANGELOG.read_text(encoding="utf-8"), re.M)
    assert headings[0] == "Unreleased"
    assert headings[1] == celery_redlock.__version__, "no CHANGELOG.md section for this version"
