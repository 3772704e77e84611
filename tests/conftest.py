"""Shared fixtures: every test must leave no process and no temp file behind."""
from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import time

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import tiers  # noqa: E402  (tests/ is on the path now)
from shared_clusters import (SHARED_FIXTURES, SHARED_GROUPS, fake_ray, real_hosts_pair, slurm,  # noqa: E402,F401
                             xdist_group)  # (session fixtures)

# On a machine with CUDA, torch.cuda.is_available() initializes the CUDA driver in pytest's process (through
# cudaGetDeviceCount), and from then on the launcher rightly refuses start_method="fork" in every later test. Asked
# through NVML, as the launcher asks, it initializes nothing: with or without a GPU, only the CUDA tests change.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

# On a GPU machine, importing notebook_accel with torch's CUDA build would start the fork server in the background
# (backends/processes/warm_start.py) in pytest's process and in every script and kernel the tests start: the suite
# keeps the behaviour it describes; tests/test_warm_start.py and test_cuda_machine.py turn it on where they test it.
os.environ["NOTEBOOK_ACCEL_WARM_START"] = "0"

# Our own temp dir for the whole session, inherited by every rank and script the tests start, so the
# leftover check below sees only what this suite made (not other programs sharing /tmp).
# Under pytest-xdist each worker makes its own, beside (not inside) the controller's: nested paths grow past the
# 108 bytes a Unix socket path may have (Chromium's SingletonSocket, Jupyter's kernels).
_SYSTEM_TMP = os.environ.setdefault("NOTEBOOK_ACCEL_TESTS_SYSTEM_TMP", tempfile.gettempdir())
SESSION_TMP = tempfile.mkdtemp(prefix="notebook_accel-tests-", dir=_SYSTEM_TMP)
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TMP

# A C++ build (DeepSpeed's ops, torch's cpp_extension) would land here: no test may pay one (a fresh machine has
# an empty extensions dir; 30 s to minutes of g++ would eat a test's timeout). Checked after every test.
TORCH_EXTENSIONS = os.path.join(SESSION_TMP, "torch_extensions")
os.makedirs(TORCH_EXTENSIONS)
os.environ["TORCH_EXTENSIONS_DIR"] = TORCH_EXTENSIONS


# NOTEBOOK_ACCEL_CUDA_STAND_IN=1: this machine as one with a CUDA driver and torch's CUDA build (see
# tests/cuda_stand_in.py), installed before any test module imports torch.
if os.environ.get("NOTEBOOK_ACCEL_CUDA_STAND_IN") == "1":
    import cuda_stand_in

    cuda_stand_in.install(os.path.join(SESSION_TMP, "cuda_stand_in"))

# Removed at exit after multiprocessing removed its own temp dir inside it (priority -100 runs first).
multiprocessing.util.Finalize(None, shutil.rmtree, args=(SESSION_TMP,), kwargs={"ignore_errors": True},
                              exitpriority=-101)


def is_kept_helper(process: psutil.Process) -> bool:
    """multiprocessing's fork server and resource tracker stay up on purpose (warm second launch);
    they belong to this process and exit with it. So do a fake Ray cluster's process trees, and the nodes a module
    keeps up on real hosts, and a module's shared Jupyter kernel, until its test module ends
    (``ray_cluster.KEPT_TREES``, ``real_hosts.KEPT_TREES``, ``typing_kernel.KEPT_TREES``; looked up, not imported:
    ``conftest`` may name notebooks/' conftest there)."""
    kept = set().union(*(getattr(sys.modules.get(name), "KEPT_TREES", ())
                         for name in ("ray_cluster", "real_hosts", "typing_kernel")))
    try:
        command = " ".join(process.cmdline())
        if kept and any(ancestor.pid in kept for ancestor in [process] + process.parents()):
            return True
    except psutil.Error:
        return True
    return "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command


def leftover_children(timeout: float = 5.0):
    """Children of this process still alive after ``timeout`` (zombies and kept helpers excluded)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and not is_kept_helper(child):
                    alive.append(child)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def temp_entries():
    kept = multiprocessing.process.current_process()._config.get("tempdir")  # the fork server's socket dir
    return {name for name in os.listdir(tempfile.gettempdir())
            if os.path.join(tempfile.gettempdir(), name) != kept}


def pytest_configure(config):
    """Take SIGINT and SIGQUIT back when the suite started with them ignored.

    A shell without job control (a script, ``bash -c``) that runs a command in the background (``pytest &``)
    starts it with SIGINT and SIGQUIT ignored; Python keeps an inherited ignore, and so does every process started
    from here — the scripts the interrupt tests start then never see their Ctrl-C, and those tests hang. (Seen:
    a hung script with SigIgn ``...1006``, exactly these two.) In this process (and each xdist worker)
    they get Python's own defaults back, as in a foreground run."""
    if sigint_ignored():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    if os.environ.get("NOTEBOOK_ACCEL_TIMELINE"):
        config.pluginmanager.register(Timeline(os.environ["NOTEBOOK_ACCEL_TIMELINE"]), "notebook_accel-timeline")


@pytest.fixture(autouse=True)
def interrupts_still_work():
    """Fail a test that leaves this process's SIGINT handling changed (ignored, blocked, or another handler):
    Ctrl-C would no longer stop a launch here, and every script a later test starts inherits an ignored or blocked
    SIGINT (Python keeps it so), so later tests that interrupt their ranks hang instead. Put back for the tests
    after it."""
    before, ignored_before = signal.getsignal(signal.SIGINT), sigint_ignored()
    blocked_before = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after, ignored_after = signal.getsignal(signal.SIGINT), sigint_ignored()
    blocked_after = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if after is not before or ignored_after != ignored_before or blocked_after != blocked_before:
        signal.signal(signal.SIGINT, before)
        if blocked_after and not blocked_before:  # blocked in this (the main) thread: children inherit that too
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        raise AssertionError(f"the test left SIGINT's handling changed: {after!r} (ignored by the OS: "
                             f"{ignored_after}, blocked: {blocked_after}), was {before!r} (ignored: "
                             f"{ignored_before}, blocked: {blocked_before})")


def sigint_ignored() -> bool:
    """Whether the OS ignores SIGINT for this process: C code (a library's sigaction) can set that without Python's
    ``signal.getsignal`` seeing it."""
    try:
        with open("/proc/self/status") as status:
            mask = int(status.read().split("SigIgn:")[1].split()[0], 16)
    except (OSError, IndexError, ValueError):  # not Linux
        return False
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.fixture(autouse=True)
def no_leftovers():
    """Fail a test that leaves a child process or a new temp file/dir behind."""
    before = temp_entries()
    yield
    alive = leftover_children()
    for child in alive:
        child.kill()
    assert not alive, f"processes left running: {[(c.pid, c.cmdline()) for c in alive]}"
    # pytest's own tmp_path root, and torch's inductor cache (torch 2.13 creates it on the first
    # optimizer.step(), in any process) are not ours.
    new = {name for name in temp_entries() - before if not name.startswith(("pytest-of-", "torchinductor_"))}
    assert not new, f"temp entries left behind: {sorted(new)}"


# ----------------------------------------------------------------------------------------------- tiers

def pytest_ignore_collect(collection_path, config):
    """``pytest -m unit`` does not even import the other tiers' files (DeepSpeed, nbclient, ...)."""
    tier = tiers.tier_of(collection_path.name) if collection_path.name.startswith("test_") else None
    if tier is not None and tiers.selects(config.option.markexpr or "", tier) is False:
        return True
    return None


@pytest.hookimpl(tryfirst=True)   # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Each test gets its file's tier as a marker (tests/tiers.py); a file without one is an error. The files that
    make this process a Ray driver go last (``tiers.RAY_DRIVER_FILES``). Each test also gets its file's xdist group
    (``shared_clusters.xdist_group``): under ``--dist loadgroup`` a file's tests run in one worker, as under
    ``loadfile``, and the files sharing a session's cluster all run in one (which makes it once)."""
    items.sort(key=lambda item: item.path.name in tiers.RAY_DRIVER_FILES)  # stable: the rest keep their order
    unmapped, unshared = set(), set()
    for item in items:
        tier = tiers.tier_of(item.path.name)
        if tier is None:
            unmapped.add(item.path.name)
        else:
            item.add_marker(tier)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.path.name)))
        shared = set(getattr(item, "fixturenames", ())) & set(SHARED_FIXTURES)
        if shared and item.path.name not in SHARED_GROUPS:   # its worker would make a second cluster, and keep it
            unshared.add(f"{item.path.name} ({', '.join(sorted(shared))})")
    if unshared:
        raise pytest.UsageError(f"test files that use a shared cluster but are not in shared_clusters.SHARED_GROUPS "
                                f"(tests/suite_schedule.py runs each group's files in one worker, last): "
                                f"{sorted(unshared)}")
    if unmapped:
        raise pytest.UsageError(f"test files without a tier in tests/tiers.py: {sorted(unmapped)}")


@pytest.fixture(scope="session", autouse=True)
def neutral_working_directory():
    """Scripts (``python -c``), ranks and kernels the tests start without a ``cwd`` run in the session's temp
    dir: with the checkout as their working directory, Python would put it first on their path and they would
    import the checkout instead of the installed package the tests are about (``python -c`` puts the current
    directory first). Anything a test writes there by mistake is then caught as a leftover, too."""
    before = os.getcwd()
    os.chdir(SESSION_TMP)
    yield
    os.chdir(before)


# ------------------------------------------------------------------------------------------------ GPUs

_GPUS_HERE = None
VISIBLE_AT_START = os.environ.get("CUDA_VISIBLE_DEVICES")


def gpus_here() -> int:
    """CUDA devices on this machine, asked once, through NVML (nothing is initialized in pytest's process)."""
    global _GPUS_HERE
    if _GPUS_HERE is None:
        from notebook_accel.plan.devices import cuda_device_count

        _GPUS_HERE = cuda_device_count()
    return _GPUS_HERE


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """On a machine with GPUs, a launch that names no device runs on them, one rank per GPU. Most tests here are
    about CPU ranks and ask for 2 without naming a device, as a user of a CPU-only runtime writes; on a 1-GPU
    machine each would be refused ("num_processes=2 is more than the 1 cuda devices"). So they see no GPU
    (``CUDA_VISIBLE_DEVICES=""``, inherited by their ranks, scripts and kernels), as on the CI machine. Tests marked
    ``cuda`` see the GPUs, and so do the notebooks, which must run as they are on any runtime. Set before each
    test's fixtures (its module's too: they may start ranks), and before nbval starts a notebook's kernel."""
    if not gpus_here():
        return
    if item.get_closest_marker("cuda") is not None or item.path.suffix == ".ipynb":
        if VISIBLE_AT_START is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = VISIBLE_AT_START
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True)
def no_cpp_build():
    """No test compiles a C++ extension (see TORCH_EXTENSIONS above)."""
    yield
    built = os.listdir(TORCH_EXTENSIONS)
    shutil.rmtree(TORCH_EXTENSIONS, ignore_errors=True)
    os.makedirs(TORCH_EXTENSIONS, exist_ok=True)
    assert not built, f"a C++ extension was built during this test (in TORCH_EXTENSIONS_DIR): {built}"


def pytest_sessionfinish(session, exitstatus):
    """The notebooks (nbval runs them after tests/, without its fixtures) compile nothing either."""
    built = os.listdir(TORCH_EXTENSIONS) if os.path.isdir(TORCH_EXTENSIONS) else []
    if built:
        print(f"\na C++ extension was built during the run (in TORCH_EXTENSIONS_DIR, by a notebook?): {built}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------------------------------------------------------ the run's timeline

class Timeline:
    """With ``NOTEBOOK_ACCEL_TIMELINE=path``, a line per test (worker, start, end, test) — what ``--durations`` cannot
    say: which worker's files end last, and so where the wall time of a parallel run goes (scripts/timeline.py).
    A plugin of its own (registered in ``pytest_configure``): a conftest's own ``pytest_runtest_log*`` hooks are
    called for its directory's tests only, and the notebooks' cells are not under tests/."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started: dict = {}

    def pytest_runtest_logstart(self, nodeid, location):
        self.started[nodeid] = (time.time(), _cpu_seconds_of_this_process_tree())

    def pytest_runtest_logfinish(self, nodeid, location):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        started, cpu_at_start = self.started.pop(nodeid, (time.time(), None))
        cpu = "" if cpu_at_start is None else f"\t{_cpu_seconds_of_this_process_tree() - cpu_at_start:.2f}"
        with open(self.path, "a") as out:
            out.write(f"{worker}\t{started:.3f}\t{time.time():.3f}\t{nodeid}{cpu}\n")


def _cpu_seconds_of_this_process_tree() -> float:
    """CPU seconds used so far by this worker, its reaped children, and its live descendants (a test's ranks,
    kernels, a cluster's daemons it started): a test's share is the difference around it. What this machine's two
    cores spend, not what the test waits for, is what decides the suite's wall time."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:4])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:4])
        except psutil.Error:
            pass
    return total


@pytest.hookimpl(optionalhook=True)   # xdist's hook: the XLA venv's pytest (scripts/test_xla_cpu.sh) has no xdist
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile`` (setup.cfg), the suite's own order of files (tests/suite_schedule.py)."""
    if config.getvalue("dist") == "loadfile":
        from suite_schedule import SuiteScheduling

        return SuiteScheduling(config, log)
    return None
