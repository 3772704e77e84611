"""The examples in the package's docstrings run, as written (``>>>`` lines; those marked ``+SKIP`` stay skipped:
they need ranks, a GPU or a notebook). One of them is the root-cause rule's own check."""
from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import notebook_accel


def every_module():
    """Every module of the installed package (``__main__`` modules run a program when imported: left out)."""
    return sorted(name for _, name, _ in pkgutil.walk_packages(notebook_accel.__path__, "notebook_accel.")
                  if not name.endswith(".__main__"))


def test_every_docstring_example_in_the_package_runs():
    failures, examples = {}, 0
    for name in ["notebook_accel"] + every_module():
        module = importlib.import_module(name)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        report = io.StringIO()
        for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
            runner.run(test, out=report.write)
        examples += runner.tries
        if runner.failures:
            failures[name] = report.getvalue()
    assert not failures, "\n".join(f"{name}:\n{text}" for name, text in failures.items())
    assert examples > 20  # the walk found the package's examples (25 when this test was written)
