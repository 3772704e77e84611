"""The fenced code blocks of the README and of every docs page (``pages()``), each with the
``<!-- readme-test: HOW (WHY) -->`` line above it that says how the tests check it (tests/test_readme.py). Every
block must have one: a block nobody runs is a block that can lie. A block moved to another page is checked there;
a new page's blocks are checked as soon as the page exists.

HOW, for ``python`` blocks:
  run           executed as a script, after the page's ``stand in`` blocks above it (or, on a page without
                one, the test's own small stand-ins for the user's ``make_model``, ...)
  stand in      the user's own functions a page's examples use, folded on the page: run, as written, before
                each ``run`` block below it
  kernel cell   executed as one cell of a real Jupyter kernel, the page's kernel cells in order
  fake tpu      executed as a script on a fake TPU host (tests/fake_tpu.py: no TPU here)
  signature     compared with the real signature of the function it names (``notebook_launcher(...)``)
  names only    only the names are checked (WHY says what it needs that the test machine lacks)
and for ``bash`` blocks:
  ci            the set-up and test commands: ``.ci/run`` runs them (checked line by line)
  shell         executed line by line in a temporary directory (WHY says with which stand-ins)
  files         the scripts it names exist and answer ``--help``, the extras it installs exist (WHY says why it
                is not run whole)
and for plain blocks (no language):
  output        what the ``kernel cell`` block above it shows (its last expression's value), compared
  transcript    an interactive exchange (a pdb prompt answered): WHY names the test files that type it, which
                must exist
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import List, Optional

PYTHON_HOWS = {"run", "stand in", "kernel cell", "fake tpu", "signature", "names only"}
BASH_HOWS = {"ci", "shell", "files"}
PLAIN_HOWS = {"output", "transcript"}

_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M)
_MARKER = re.compile(r"<!-- readme-test: (?P<how>[a-z ]+?)(?: \((?P<why>[^)]*)\))? -->\n$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int          # of the opening fence, 1-based
    lang: str
    code: str
    how: Optional[str]  # None: no marker above the fence
    why: Optional[str]

    def __str__(self) -> str:
        return f"{self.name}:{self.line} ({self.lang}, {self.how})"

    @property
    def name(self) -> str:
        """The page as the repository names it: ``README.md``, ``docs/session.md``."""
        parts = os.path.normpath(self.page).split(os.sep)
        if parts[-1] == "README.md" or "docs" not in parts[:-1]:
            return parts[-1]
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("docs"):])  # from the last docs/ down


def pages(repo: str) -> List[str]:
    """The pages whose blocks are checked: ``README.md``, then every Markdown page under ``docs/``."""
    return [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "**", "*.md"),
                                                                recursive=True))


def blocks(page: str) -> List[Block]:
    """Every fenced block of ``page`` with its marker (``how`` None where there is none)."""
    with open(page) as handle:
        text = handle.read()
    found = []
    for fence in _FENCE.finditer(text):
        before = text[:fence.start()]
        previous_line = before[before.rstrip("\n").rfind("\n") + 1:] if before.endswith("\n") else ""
        marker = _MARKER.match(previous_line)
        found.append(Block(page=page, line=before.count("\n") + 1, lang=fence.group("lang"), code=fence.group("code"),
                           how=marker.group("how") if marker else None, why=marker.group("why") if marker else None))
    return found


def of(page: str, how: str, lang: Optional[str] = None) -> List[Block]:
    """The blocks of ``page`` checked ``how``."""
    return [block for block in blocks(page) if block.how == how and (lang is None or block.lang == lang)]


def command_lines(code: str) -> List[str]:
    """A bash block's commands: its lines without comments (a trailing ``# ...`` too) and blank lines."""
    commands = []
    for line in code.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            commands.append(command)
    return commands
