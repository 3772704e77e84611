"""Running a script or a module as ``__main__`` inside a rank (``notebook-accel launch script.py args…``).

The launched function is ``run_main``, a module-level function, so it pickles by reference and every
start method can import it. Inside the rank the script sees its own ``sys.argv`` and ``__name__ ==
"__main__"``; ``sys.exit(0)`` is a normal end and ``sys.exit(n)`` a failure with exit code ``n`` (the
rank's ``run_function`` already treats ``SystemExit`` that way).
"""
from __future__ import annotations

import builtins
import importlib.util
import linecache
import os
import runpy
import sys
import types
from typing import List, Sequence

from ..errors import LaunchConfigError


def run_main(target: str, argv: Sequence[str], as_module: bool) -> None:
    """Run ``target`` (a script path, or a module name when ``as_module``) as ``__main__`` with ``argv``.

    >>> run_main("train.py", ["--epochs", "1"], as_module=False)  # doctest: +SKIP
    """
    if as_module:
        sys.argv = [target] + list(argv)  # runpy replaces argv[0] with the module's file
        sys.path.insert(0, os.getcwd())    # as `python -m` does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target] + list(argv)
        sys.path.insert(0, os.path.dirname(target))  # as `python script.py` does
        runpy.run_path(target, run_name="__main__")


def run_source(path: str, source: str, argv: Sequence[str]) -> None:
    """Run a script's text as ``__main__``, as ``run_main`` runs its file: for a rank on another machine (a Ray
    cluster's node), where the kernel's path names nothing. Tracebacks and pdb show its lines (``linecache``);
    files beside the script are not there, so what it imports must be installed on the node.

    >>> run_source("/home/me/train.py", "import sys; print(sys.argv)", ["--epochs", "1"])  # doctest: +SKIP
    ['/home/me/train.py', '--epochs', '1']
    """
    sys.argv = [path] + list(argv)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)  # its lines, with no file to read
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle and dataclasses look classes up there, as under run_path
    try:
        exec(compile(source, path, "exec"), main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def check_target(target: str, as_module: bool) -> str:
    """The script's absolute path (or the module name), or a clear error before any process starts."""
    if as_module:
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError) as err:
            found, reason = None, f": {err}"
        else:
            reason = ""
        finally:
            sys.path.pop(0)
        if found is None:
            raise LaunchConfigError(f"no module named {target!r} can be imported from here{reason}")
        return target
    path = os.path.abspath(target)
    if not os.path.isfile(path):
        raise LaunchConfigError(f"script {target!r} does not exist (looked for {path})")
    return path


def script_label(target: str, argv: List[str], as_module: bool) -> str:
    """A short name for headers: ``python train.py --epochs 1`` / ``python -m pkg.train``."""
    words = ["python", "-m", target] if as_module else ["python", os.path.basename(target)]
    return " ".join(words + list(argv))[:100]
