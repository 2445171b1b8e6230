"""What a release is made of: one version, which the installed package's metadata
reads."""

from __future__ import annotations

from importlib.metadata import version

import celery_redlock


def test_the_version_is_the_installed_distributions() -> None:
    # An editable install reads the version when installed: reinstall after a bump.
    assert celery_redlock.__version__ == version("celery-redlock")
