"""Sphinx configuration of rabit_py's reference site (``docs/``).

Build: ``pip install -e ".[docs]" && sphinx-build -W -b html docs docs/_build``
(``.ci/run`` builds it with warnings as errors)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rabit_py import __version__  # noqa: E402

project = "rabit_py"
author = "rabit_py developers"
copyright = "2026, rabit_py developers"
release = version = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
# The optional extras are not needed to build the reference: their modules
# are imported lazily by rabit_py, and mocked here where a page documents them.
autodoc_mock_imports = ["torch", "cupy", "cupyx", "xgboost"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"


def _skip_request_setters(app, what, name, obj, skip, options):
    """scikit-learn's generated ``set_*_request`` methods: not ours, and
    their docstrings cite scikit-learn's own glossary."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_request_setters)

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "alabaster"
html_static_path = ["_static"]
# Long code lines wrap instead of being cut off at the page's edge.
html_css_files = ["wrap.css"]
html_theme_options = {"description": "Fault-tolerant collectives on MPI for BSP training",
                      "fixed_sidebar": True}
exclude_patterns = ["_build"]
extensions.append("myst_parser")
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
# The README's sections are included into these pages; their headings start
# at its own levels (### under a page's #).
suppress_warnings = ["myst.header"]
