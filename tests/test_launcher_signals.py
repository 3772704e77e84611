"""Interrupts, a killed kernel and concurrent notebooks, with the launcher in its own Python process."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from scripts import run_script, running, script_env, start_script
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)

HANGING_LAUNCH = """
    import os, sys, time
    import psutil
    from notebook_accel import notebook_launcher

    def work():
        print("READY", os.getpid(), flush=True)
        time.sleep(600)

    def kept(process):
        command = " ".join(process.cmdline())
        return "forkserver" in command or "resource_tracker" in command

    try:
        notebook_launcher(work, num_processes=2, display="text", start_method={method!r})
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    left = [c.pid for c in psutil.Process().children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE and not kept(c)]
    print("LEFT", left, flush=True)
    print("AGAIN", notebook_launcher(lambda: os.environ["WORLD_SIZE"], num_processes=2, display="none"), flush=True)
"""


def wait_for_ready_ranks(process, count=2):
    """Read the script's stdout until ``count`` ranks said READY; return their pids."""
    pids = []
    while len(pids) < count:
        line = process.stdout.readline()
        assert line, f"script ended early: {process.stderr.read()}"
        if "READY" in line:
            pids.append(int(line.split()[-1]))
    return pids


def assert_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if running(pid)]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"ranks still alive: {alive}")


def assert_session_ends(session_id, within=20.0):
    """Every process of a killed script's session (its fork server, resource tracker) ends, and so has done its
    clean-up (the fork server removes the kernel's temp dir as it exits): only then is "nothing left" true."""
    import psutil

    def members():
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getsid(process.pid) == session_id and running(process.pid):
                    found.append(process.pid)
        return found

    wait_until(lambda: not members(), within, f"every process of the killed script's session {session_id} to end")


@pytest.mark.parametrize("target", ["launcher", "process group"])
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_sigint_stops_every_rank_and_raises_keyboard_interrupt(target, method):
    process = start_script(HANGING_LAUNCH.format(method=method), start_new_session=True)
    try:
        pids = wait_for_ready_ranks(process)
        if target == "launcher":
            os.kill(process.pid, signal.SIGINT)
        else:  # what Jupyter's interrupt does: the kernel's whole process group
            os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert "INTERRUPTED" in out, err
    assert "LEFT []" in out
    assert "AGAIN 2" in out, err  # the next launch in the same "kernel" works
    assert_gone(pids)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_ranks_die_with_a_sigkilled_kernel(method):
    process = start_script(HANGING_LAUNCH.format(method=method), start_new_session=True)
    try:
        pids = wait_for_ready_ranks(process)
        process.kill()
        process.wait(10)
        assert_gone(pids)
        assert_session_ends(process.pid)
    finally:
        process.kill()
        process.communicate()


ORPHANED_SERVER = """
    import os, subprocess, sys, time
    # The fork server's exit-time clean-up, in a child of this stand-in kernel that checks while the kernel lives
    server = subprocess.Popen([sys.executable, "-c", "import os, sys; "
                               "from notebook_accel.rank.forkserver_preload import _remove_if_orphaned; "
                               "print('CHECKING', flush=True); "
                               "_remove_if_orphaned(os.getppid(), sys.argv[1], wait_s={wait_s})", {folder!r}],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "CHECKING\\n"
    time.sleep({kernel_lives_s})  # the server's first look at its parent finds this kernel alive
    print("SERVER", server.pid, flush=True)
"""


@pytest.mark.parametrize("kernel_lives_s, wait_s, removed", [(0.5, 10, True), (2.0, 0.3, False)],
                         ids=["kernel-gone-during-the-wait", "kernel-alive-after-the-wait"])
def test_the_fork_servers_clean_up_waits_to_be_orphaned_and_never_removes_a_live_kernels_dir(
        tmp_path, kernel_lives_s, wait_s, removed):
    # Why: a killed kernel's fork server reads EOF when the OS closes the kernel's files, which comes before
    # the OS re-parents the server, so one look at the parent at once could find the dying kernel still there
    # and keep its pymp-* dir (a CI run's failure of test_ranks_die_with_a_sigkilled_kernel[forkserver]).
    folder = tmp_path / "pymp-of-the-kernel"
    folder.mkdir()
    env = {k: v for k, v in script_env().items() if k != "NOTEBOOK_ACCEL_FORKSERVER_OWNER"}
    kernel = subprocess.run([sys.executable, "-c", textwrap.dedent(ORPHANED_SERVER.format(
        folder=str(folder), wait_s=wait_s, kernel_lives_s=kernel_lives_s))],
        env=env, capture_output=True, text=True, timeout=60)
    assert kernel.returncode == 0, kernel.stderr
    server = int(kernel.stdout.split("SERVER")[1])
    assert_gone([server], within=20)
    assert folder.exists() is not removed


def test_a_kernel_never_imports_the_fork_servers_clean_up():
    # Imported, it registers the clean-up in the importer; a kernel whose parent kernel had a fork server (a script
    # run from a cell, a test's subprocess) then waited 5 s at its exit for a re-parenting that never came.
    done = run_script("""
        import os, sys
        from notebook_accel import notebook_launcher
        print("RESULT", notebook_launcher(lambda: 7, num_processes=2, start_method="forkserver", display="none"))
        print("IMPORTED", "notebook_accel.rank.forkserver_preload" in sys.modules)
    """)
    assert "RESULT 7" in done.stdout, done.stdout + done.stderr
    assert "IMPORTED False" in done.stdout, done.stdout


def death_signal() -> int:
    """The signal this process gets when its parent dies (``prctl(PR_GET_PDEATHSIG)``; 0: none)."""
    import ctypes
    import signal as signals

    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(-1)
    pr_get_pdeathsig = 2
    assert libc.prctl(pr_get_pdeathsig, ctypes.byref(value), 0, 0, 0) == 0, ctypes.get_errno()
    return signals.Signals(value.value).name if value.value else "none"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_every_rank_is_set_to_die_by_sigkill_with_its_parent(method):
    # One of the two mechanisms behind "ranks die with the kernel", read on its own: the lifeline thread
    # would kill the ranks anyway in every other test, so losing PR_SET_PDEATHSIG changed nothing visible.
    from notebook_accel import notebook_launcher

    signals = notebook_launcher(death_signal, num_processes=2, display="none", return_all=True, start_method=method)
    assert signals == ["SIGKILL", "SIGKILL"]


LIFELINE_CANNOT_RUN = """
    import ctypes, os, time
    from notebook_accel import notebook_launcher

    def work():
        print("READY", os.getpid(), flush=True)
        # libc sleep() with the GIL held (PyDLL keeps it): the rank's lifeline thread sees EOF but never gets
        # to run its kill, so only the kernel's death signal (PR_SET_PDEATHSIG) can end this rank
        ctypes.PyDLL(None).sleep(120)

    notebook_launcher(work, num_processes=2, display="text", start_method={method!r})
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("method", ["fork", "spawn"])  # the kernel is their parent (a forkserver rank's is the server)
def test_ranks_die_with_a_sigkilled_kernel_while_their_lifeline_thread_is_blocked(method):
    process = start_script(LIFELINE_CANNOT_RUN.format(method=method), start_new_session=True)
    pids = []
    try:
        pids = wait_for_ready_ranks(process)
        time.sleep(0.5)  # both ranks are past print, in libc sleep() with the GIL held
        process.kill()
        process.wait(10)
        assert_gone(pids)
        assert_session_ends(process.pid)
    finally:
        for pid in pids:  # a red run: the ranks outlived the kernel (and hold its pipes); end them first
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.kill()
        process.communicate()


CONCURRENT_LAUNCH = """
    import torch, torch.distributed as dist
    from notebook_accel import notebook_launcher

    def reduce_many(tag):
        dist.init_process_group("gloo")
        total = torch.zeros(1)
        for step in range(20):
            value = torch.ones(1) * (dist.get_rank() + 1)
            dist.all_reduce(value)
            total += value
        return tag, float(total)

    for attempt in range(3):
        print("RESULT", notebook_launcher(reduce_many, args=({tag!r},), num_processes=2, display="none"), flush=True)
"""


def test_two_notebooks_launching_at_the_same_time_both_succeed():
    first = start_script(CONCURRENT_LAUNCH.format(tag="first"))
    second = start_script(CONCURRENT_LAUNCH.format(tag="second"))
    outputs = [process.communicate(timeout=100) for process in (first, second)]
    for (out, err), tag in zip(outputs, ("first", "second")):
        assert out.count(f"RESULT ('{tag}', 60.0)") == 3, err
