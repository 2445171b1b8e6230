"""Sphinx configuration of the documentation site (``tools/docs/build.sh`` builds it).

The pages are Markdown (MyST): most of them are the text that README.md used to hold,
and SAFETY.md and the benchmark results (``bench/results/*.md``) are included from
where they live, not copied. The API reference is reST, generated from the docstrings.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))

project = "celery-redlock"
author = "celery-redlock contributors"
copyright = "celery-redlock contributors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.intersphinx"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Links between pages and to their headings: `[text](page.md#a-heading)`.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
# The safety pages include parts of SAFETY.md, whose sections start at "###".
suppress_warnings = ["myst.header"]

# Our own names must resolve: a reference to a celery_redlock name that the API pages
# do not document is an error under -W. Names of other projects are left unlinked
# (no intersphinx inventories are fetched: the build runs offline).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!celery_redlock\b).*"),
    # Types of the layer folders and private names, named in public signatures: they
    # are not part of the API, so they stay unlinked.
    (r"py:.*", r"celery_redlock\.(wire|lock|tasks)\..*"),
    (r"py:.*", r".*\._\w+"),
]
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# One parameter a line once a signature is longer than this.
maximum_signature_line_length = 88
# Defaults as written in the source (``clock=time.monotonic``), not their repr, which
# for a function (``<built-in function monotonic>``) breaks the signature's parsing.
autodoc_preserve_defaults = True
# RedlockTask overrides some of Celery's Task methods; Celery's own docstrings refer to
# labels of Celery's documentation, which this site does not have.
autodoc_inherit_docstrings = False
# Importing django_celery_beat needs configured Django settings.
autodoc_mock_imports = ["django_celery_beat"]
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = "celery-redlock"
html_static_path = ["_static"]
html_css_files = ["wide.css"]
