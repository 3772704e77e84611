"""``cluster="ray"`` from a kernel that never called ``ray.init()``: the launcher starts a local Ray and says so, and
when the kernel exits, nothing of it is left — neither the ranks' actors (a Session left open) nor the local Ray.

Run as a script in a fresh process (a kernel of its own, with Ray's files in a temp dir: ``RAY_TMPDIR``, and ``HOME``
for Ray 2.60's token), so that no Ray of the suite's is reachable from it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from ray_cluster import FAST_IMPORTS, command_line
from scripts import script_env

pytestmark = pytest.mark.timeout(300)

SCRIPT = """
import os
from notebook_accel import Session, notebook_launcher

def rank_number():
    return int(os.environ["RANK"])

if __name__ == "__main__":
    print("RESULT", notebook_launcher(rank_number, num_processes=2, cluster="ray", display="text", return_all=True))
    session = Session(num_processes=2, cluster="ray", display="none")
    print("WARM", session.run(rank_number, return_all=True), "on pids", session.run(os.getpid, return_all=True))
    # the session is left open, as a notebook closed without session.close() leaves it
"""


def processes_under(path: str):
    """Processes whose command line names ``path`` (Ray's GCS, raylet and workers name their session dir)."""
    return [process for process in psutil.process_iter() if path in command_line(process)]


def test_a_kernel_without_ray_init_gets_a_local_ray_said_once_and_leaves_nothing_at_exit():
    temp = tempfile.mkdtemp(prefix="na-rl-", dir="/tmp")  # short: Ray's socket paths live under it
    env = dict(script_env(), RAY_TMPDIR=temp, HOME=temp,
               PYTHONPATH=os.pathsep.join([FAST_IMPORTS, script_env()["PYTHONPATH"]]))
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, cwd=temp,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
        shown = done.stdout + done.stderr
        assert done.returncode == 0, shown
        assert "RESULT [0, 1]" in done.stdout and "WARM [0, 1]" in done.stdout, shown
        said = [line for line in done.stderr.splitlines() if "Ray was not initialized" in line]
        assert said == ["notebook_accel: Ray was not initialized in this kernel; calling ray.init() (a local Ray on "
                        "this machine). Call ray.init(address=...) first to choose the cluster."], shown
        pids = [int(pid) for pid in done.stdout.split("on pids [", 1)[1].split("]", 1)[0].split(", ")]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (processes_under(temp) or any(psutil.pid_exists(p) for p in pids)):
            time.sleep(0.5)
        left = [(process.pid, command_line(process)[:200]) for process in processes_under(temp)]
        assert not left, f"the kernel's local Ray outlived it: {left}"
        assert not [pid for pid in pids if psutil.pid_exists(pid)], "the session's actors outlived the kernel"
    finally:
        for process in processes_under(temp):
            try:
                process.kill()
            except psutil.Error:  # gone meanwhile
                pass
        shutil.rmtree(temp, ignore_errors=True)
