"""The docs: the README is a front door (short, the dashboard's picture, links that lead somewhere), every page under
docs/ is in the site's nav, and the site builds with warnings as errors — its options reference naming every option
of the table, its API reference every public name. (The pages' code blocks: tests/test_readme.py.)"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest
import yaml

from scripts import REPO

README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")
README_MOST_BYTES = 15 * 1024


def _local_links(page: str):
    """The targets of a Markdown page's links and images that are files of the repository (``#anchor`` cut)."""
    with open(page) as handle:
        targets = re.findall(r"\]\(([^)\s]+)\)", handle.read())
    return [target.split("#")[0] for target in targets if not re.match(r"[a-z]+:", target) and target[0] != "#"]


def _nav_pages(nav):
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


def test_the_readme_is_a_front_door():
    size = os.path.getsize(README)
    assert size <= README_MOST_BYTES, f"README.md is {size} bytes: move the detail to a page under docs/"
    links = _local_links(README)
    assert "docs/images/dashboard.png" in links, "the README shows the dashboard's picture"
    for target in links:
        assert os.path.exists(os.path.join(REPO, target)), f"README.md links to {target}, which does not exist"
    linked_pages = {target for target in links if target.startswith("docs/") and target.endswith(".md")}
    assert {"docs/getting-started.md", "docs/options.md", "docs/api.md"} <= linked_pages


def test_every_docs_page_is_in_the_nav():
    """A page on disk but not in the nav is unreachable on the site (the strict build says so too, more slowly)."""
    with open(os.path.join(REPO, "mkdocs.yml")) as handle:
        config = yaml.safe_load(handle)
    in_nav = list(_nav_pages(config["nav"]))
    on_disk = {os.path.relpath(page, DOCS) for page in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)}
    assert sorted(in_nav) == sorted(on_disk)
    # the pages other branches write drop in under these names
    assert {"debugging.md", "clusters.md", "several-machines.md"} <= set(in_nav)


@pytest.mark.timeout(300)
def test_the_site_builds_strictly_and_names_every_option(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings"):
        pytest.importorskip(module, reason='the docs extra: pip install ".[docs]"')
    import notebook_accel
    from notebook_accel.plan.options import ALL_OPTIONS

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    options = (site / "options" / "index.html").read_text()
    missing = [option.name for option in ALL_OPTIONS if f'id="{option.name}"' not in options]
    assert not missing, f"the options reference has no section for {missing}"
    from notebook_accel.plan.variables import ENVIRONMENT_VARIABLES

    unsaid = [variable.name for variable in ENVIRONMENT_VARIABLES if not variable.internal
              and f"<code>{variable.name}</code>" not in options]
    assert 'id="environment-variables"' in options and not unsaid, f"the options reference leaves out {unsaid}"
    assert "autocast" in options  # mixed_precision says what it does, not only what it exports
    api = (site / "api" / "index.html").read_text()
    public = [getattr(notebook_accel, name) for name in notebook_accel.__all__ if name != "__version__"]
    undocumented = [f"{thing.__module__}.{thing.__qualname__}" for thing in public
                    if f'id="{thing.__module__}.{thing.__qualname__}"' not in api]
    assert not undocumented, f"the API reference lacks {undocumented}"
    assert "{options}" not in api, "an entry point's options were not filled into its docstring"


def test_the_session_pages_code_fits_its_column():
    # the page has a table of contents on the right: its code column is narrower than 120 characters, and the
    # longest comments ran out of the box (about 100 characters fit at Material's code size)
    import doc_blocks

    long = [line for block in doc_blocks.blocks(os.path.join(REPO, "docs", "session.md"))
            for line in block.code.splitlines() if len(line) > 100]
    assert long == []
