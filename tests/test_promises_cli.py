"""Promises of docs/cli.md about ``notebook-accel launch`` that no other test exercised (issue 17 §3, item 6), each
run as a user runs it: a fresh process launching real ranks, with a private ``HF_HOME`` so no user config is read.

Already covered in tests/test_cli.py: exit code 124 and ``--timeout`` (test_exit_code_is_the_root_cause_ranks),
``sys.exit(n)`` → n and an exception → 1 (the same test), Ctrl-C → 130, bad options → 2.
Here: a rank killed by signal N → 128+N; ``--start-method``; ``--rdzv-conf``; ``--config-file`` read for its
values; and the installed ``notebook-accel`` console script itself (not ``python -m notebook_accel.cli``).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from scripts import script_env

pytestmark = pytest.mark.timeout(300)

SCRIPT = """
import multiprocessing, os, signal, sys, time
import psutil

def start_method():
    # How this rank was started: a spawn child runs multiprocessing's spawn entry point; a forkserver child's
    # parent is the fork server; a forked rank's command line is its launcher's.
    if "--multiprocessing-fork" in " ".join(psutil.Process().cmdline()):
        return "spawn"
    if "from multiprocessing.forkserver import main" in " ".join(psutil.Process().parent().cmdline()):
        return "forkserver"
    return "fork"

print(f"hello rank={os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
      f"precision={os.environ['ACCELERATE_MIXED_PRECISION']} started_by={start_method()}", flush=True)
# A failing rank 1 fails only once every rank has said hello: a failure stops its peers, and under load rank 0 could
# be stopped before its hello (this launch's files: a folder named by its MASTER_PORT, beside the script).
greeted = os.path.join(os.path.dirname(os.path.abspath(__file__)), "greeted-" + os.environ["MASTER_PORT"])
os.makedirs(greeted, exist_ok=True)
open(os.path.join(greeted, os.environ["RANK"]), "w").close()
deadline = time.monotonic() + 120
while (("--kill" in sys.argv or "--exit" in sys.argv) and len(os.listdir(greeted)) < int(os.environ["WORLD_SIZE"])
       and time.monotonic() < deadline):
    time.sleep(0.05)
if "--kill" in sys.argv and os.environ["RANK"] == "1":
    os.kill(os.getpid(), getattr(signal, sys.argv[sys.argv.index("--kill") + 1]))
if "--exit" in sys.argv and os.environ["RANK"] == "1":
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
"""


@pytest.fixture
def home(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def env_for(home):
    env = script_env()
    env["HF_HOME"] = str(home / "hf")
    env.pop("NOTEBOOK_ACCEL_CONFIG_FILE", None)
    return env


def cli(home, *argv: str, command=(sys.executable, "-m", "notebook_accel.cli"), timeout: float = 180):
    return subprocess.run([*command, *argv], cwd=home, env=env_for(home), capture_output=True, text=True,
                          timeout=timeout)


def greetings(output: str):
    return sorted(line for line in output.splitlines() if " hello rank=" in line)


@pytest.mark.parametrize("name", ["SIGKILL", "SIGTERM", "SIGSEGV"])
def test_a_rank_killed_by_signal_n_exits_128_plus_n(home, name):
    number = getattr(signal, name)
    done = cli(home, "launch", "--num-processes", "2", "train.py", "--kill", name)
    assert done.returncode == 128 + number, (done.returncode, done.stdout, done.stderr)
    assert f"rank 1 was killed by {name}" in done.stderr, done.stderr


@pytest.mark.parametrize("spelling", ["--start-method", "--start_method"])
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_start_method_is_how_the_ranks_start(home, spelling, method):
    done = cli(home, "launch", "--num-processes", "2", spelling, method, "train.py")
    assert done.returncode == 0, done.stderr
    assert [line.split()[-1] for line in greetings(done.stdout)] == [f"started_by={method}"] * 2, done.stdout


def test_a_start_method_that_does_not_exist_is_refused(home):
    done = cli(home, "launch", "--start-method", "teleport", "train.py")
    assert done.returncode == 2 and "invalid choice: 'teleport'" in done.stderr, done.stderr


def test_rdzv_conf_reaches_the_rendezvous(home):
    # A node alone in a two-node launch waits join_timeout seconds (600 by default), here 3.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = cli(home, "launch", "--num-nodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-conf", "join_timeout=3,node_timeout=5", "train.py", timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "did not all join the 'static' rendezvous" in done.stderr and "within 3 s" in done.stderr, done.stderr
    bad = cli(home, "launch", "--rdzv-conf", "join_timeout", "train.py")
    assert bad.returncode == 2 and "'join_timeout' is not KEY=VALUE" in bad.stderr, bad.stderr


def test_config_file_gives_the_launchs_defaults_and_the_command_line_wins(home):
    (home / "team.yaml").write_text("num_processes: 2\ndevice: cpu\nmixed_precision: bf16\nstart_method: spawn\n")
    done = cli(home, "launch", "--config-file", str(home / "team.yaml"), "train.py")
    assert done.returncode == 0, done.stderr
    assert greetings(done.stdout) == [f"[rank {rank}] hello rank={rank} of 2 precision=bf16 started_by=spawn"
                                      for rank in (0, 1)], done.stdout
    overridden = cli(home, "launch", "--config_file", str(home / "team.yaml"), "--num-processes", "1",
                     "--start-method", "fork", "train.py")
    assert greetings(overridden.stdout) == ["[rank 0] hello rank=0 of 1 precision=bf16 started_by=fork"], \
        overridden.stdout + overridden.stderr
    missing = cli(home, "launch", "--config-file", str(home / "nothere.yaml"), "train.py")
    assert missing.returncode == 2 and "nothere.yaml does not exist" in missing.stderr, missing.stderr


INSTALLED = shutil.which("notebook-accel")


@pytest.mark.skipif(INSTALLED is None, reason="the notebook-accel console script is not on PATH (install the "
                                               "package with pip to get its entry point)")
def test_the_installed_console_script_launches(home):
    # The entry point pip wrote: it imports the *installed* notebook_accel (site-packages), not this checkout,
    # so this checks the packaging (console_scripts entry, its exit code), not the tree under test.
    done = cli(home, "launch", "--num-processes", "2", "train.py", "--exit", "3", command=(INSTALLED,))
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)  # the rank's code, passed through
    assert [line.split(" hello ")[0] for line in greetings(done.stdout)] == ["[rank 0]", "[rank 1]"], done.stdout
    assert "[rank 1] failed (root cause)" in done.stdout
    helped = cli(home, "--help", command=(INSTALLED,))
    assert helped.returncode == 0 and "launch" in helped.stdout
