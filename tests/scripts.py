"""Run a launcher script in a fresh Python process, as a notebook kernel or a user's script would."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from typing import Any, List

import notebook_accel
from notebook_accel.wire.events import OutputLine, OutputLines, RankEvent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the notebook_accel under test was imported from: site-packages when the tests run against an
# installed wheel (as CI does), the checkout in development. Scripts and kernels the tests start import
# the same one, never silently the checkout: it is first on their PYTHONPATH, and they run in a neutral
# working directory (conftest.py's ``neutral_working_directory``), since ``python -c`` puts the current
# directory before PYTHONPATH.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(notebook_accel.__file__)))


def script_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_script(code: str, **popen_options) -> subprocess.Popen:
    """Start ``python -c code`` (the code's functions live in ``__main__``, as in a notebook)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_options)


def run_script(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=script_env(),
                          capture_output=True, text=True, timeout=timeout)


class Recorder:
    """A view that keeps every event (tests pass it as ``start_launch(view=...)``)."""

    def __init__(self) -> None:
        self.events: List[RankEvent] = []

    def handle(self, event: RankEvent) -> None:
        if isinstance(event, OutputLines):  # recorded line by line, as tests read them
            self.events.extend(OutputLine(rank=event.rank, stream=event.stream, text=text) for text in event.lines)
        else:
            self.events.append(event)

    def tick(self) -> None:
        pass

    def of(self, kind: type) -> List[Any]:
        return [event for event in self.events if isinstance(event, kind)]


def running(pid: int) -> bool:
    """Alive and not a zombie. One question to psutil: asked as two (``pid_exists``, then ``status``), a process
    that ended in between raised ``NoSuchProcess`` (a full run's one failure)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
