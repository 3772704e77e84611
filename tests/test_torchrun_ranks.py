"""A rank launched from a notebook behaves like a torchrun rank, on every start method (issue: torchrun ranks).

Real processes throughout; most launches run in a fresh ``python -c`` script, whose functions live in
``__main__`` as a notebook's do.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch

from notebook_accel import LaunchError, LaunchTimeout, notebook_launcher
from notebook_accel.launcher import start_launch
from notebook_accel.plan.plan import plan_launch
from scripts import run_script, script_env
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)

START_METHODS = ["fork", "forkserver", "spawn"]
MIB = 1 << 20


def ok_script(code: str, timeout: float = 150) -> str:
    done = run_script(code, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


# ------------------------------------------------------------------------------ 2, 3: data is not copied

def uss_mib(*tensors):
    import torch  # noqa: F401  (a bare rank imports torch too, so both sides pay for it alike)

    for tensor in tensors:
        tensor.sum().item()  # read every page
    return psutil.Process().memory_full_info().uss / MIB


def bare_rank():
    return uss_mib()


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_200_mb_global_and_argument_are_not_copied_into_ranks(start_method):
    """As in a notebook: the global lives in ``__main__`` (a script), so it travels with the function."""
    out = ok_script(f"""
        import psutil, torch
        from notebook_accel import notebook_launcher
        big = torch.ones(50 << 20)        # 200 MiB of float32, a global the function reads
        argument = torch.ones(50 << 20)   # 200 MiB more, an argument

        def uss_mib(*tensors):
            for tensor in tensors:
                tensor.sum().item()       # read every page
            return psutil.Process().memory_full_info().uss / (1 << 20)

        def bare(small):                  # a tensor too: a spawn rank pays torch's own import alike
            return uss_mib(small)

        def reads_both(argument):
            return uss_mib(big, argument)

        options = dict(num_processes=2, display="none", start_method={start_method!r}, return_all=True)
        print("BARE", notebook_launcher(bare, args=(torch.ones(4),), **options))
        print("LOADED", notebook_launcher(reads_both, args=(argument,), **options))
    """)
    bare = eval(re.search(r"BARE (\[.*\])", out).group(1))
    loaded = eval(re.search(r"LOADED (\[.*\])", out).group(1))
    for rank in range(2):
        # A copy would add 400 MiB of private memory to each rank; allow noise, not a copy.
        assert loaded[rank] < bare[rank] + 40, (start_method, bare, loaded)


def test_an_800_mb_tensor_through_the_warm_fork_server_is_shared_not_copied():
    notebook_launcher(bare_rank, num_processes=2, display="none", start_method="forkserver")  # warm
    tensor = torch.ones(200 * MIB)  # 800 MiB
    started = time.monotonic()
    private = notebook_launcher(uss_mib, args=(tensor,), num_processes=2, display="none",
                                start_method="forkserver", return_all=True)
    elapsed = time.monotonic() - started
    assert all(value < 150 for value in private), private  # a copy would be over 800
    assert elapsed < 60, elapsed  # hang guard only; benchmarks/bench_payload.py measures it


def writes_into_its_argument(tensor):
    tensor += 1  # copy-on-write: the rank's own pages, as under fork
    return tensor[:3].tolist()


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_rank_writing_a_shared_tensor_changes_only_its_own_copy(start_method):
    tensor = torch.zeros(1 * MIB)
    results = notebook_launcher(writes_into_its_argument, args=(tensor,), num_processes=2, display="none",
                                start_method=start_method, return_all=True)
    assert results == [[1.0, 1.0, 1.0]] * 2
    assert tensor.sum().item() == 0  # the kernel's tensor is untouched


def test_numpy_arrays_travel_through_shared_memory_and_aliasing_survives():
    out = ok_script("""
        import numpy as np, torch
        from notebook_accel import notebook_launcher
        array = np.arange(1_000_000, dtype=np.float64)
        base = torch.arange(100_000.0)
        view = base[10:20]
        def check(array, base, view):
            view[0] = -1.0           # a view of the same storage: base sees it, as in the kernel
            return float(array.sum()), base[10].item(), array.flags.writeable
        print("RESULT", notebook_launcher(check, args=(array, base, view), num_processes=2,
                                          start_method="spawn", display="none"))
    """)
    assert "RESULT (499999500000.0, -1.0, True)" in out


def test_fork_runs_with_the_notebooks_real_globals():
    out = ok_script("""
        import threading
        from notebook_accel import notebook_launcher
        lock = threading.Lock()          # cannot be pickled: fine under fork
        def train():
            with lock:
                return globals()["late_name"], counter["n"]
        late_name = "bound after the function was defined"
        counter = {"n": 41}
        counter["n"] += 1
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="none"))
    """)
    assert "RESULT ('bound after the function was defined', 42)" in out


def test_a_forked_rank_does_not_touch_the_whole_notebook_namespace():
    """A forked rank shares the kernel's memory until it writes to it, and a Python object's page is written as soon
    as it is used. Before it runs the function, a rank must not go through every name in the notebook (a long
    session has thousands: every cell's ``_iN``...) — each page copied in each rank, at 16 ranks a launch 60%
    slower with 30,000 names. Counted in page faults (the system's own count), not time: the same launch with
    30,000 more names in ``__main__`` costs a rank about as many faults as without them (1,500 more before)."""
    out = ok_script("""
        import resource
        from notebook_accel import notebook_launcher
        def faults_so_far():
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        def launch():
            return max(notebook_launcher(faults_so_far, num_processes=2, start_method="fork", display="none",
                                         return_all=True))
        launch()  # the first launch imports what every launch uses
        few = min(launch() for _ in range(3))
        for index in range(30_000):  # as a long notebook session's namespace
            globals()[f"name_{index}"] = [index, str(index)]
        many = min(launch() for _ in range(3))
        print("FAULTS", few, many)
    """)
    few, many = map(int, re.search(r"FAULTS (\d+) (\d+)", out).groups())
    assert many - few < 300, f"a rank's page faults before its function: {few}, with 30,000 more names {many}"


def test_a_large_pickled_payload_names_what_makes_it_large():
    out = run_script("""
        import warnings
        from notebook_accel import notebook_launcher
        rows = [str(i) * 10 for i in range(1_500_000)]   # a big list of Python objects: ~100 MB pickled (over 64 MiB)
        def train():
            return len(rows)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            print("RESULT", notebook_launcher(train, num_processes=2, start_method="spawn", display="none"))
        print("WARNING", [str(w.message) for w in caught])
    """, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT 1500000" in out.stdout
    assert re.search(r"is \d+ MiB once pickled.*global 'rows' \(list, \d+ MiB\)", out.stdout), out.stdout[-2000:]


# ----------------------------------------------------------------------------- 4: the kernel's environment

def environment_seen():
    return os.environ.get("SET_IN_A_LATER_CELL"), os.getcwd(), sys.path[-1], os.environ["RANK"]


@pytest.mark.parametrize("start_method", START_METHODS)
def test_ranks_see_the_environment_cwd_and_path_of_the_moment_of_launch(start_method, tmp_path, monkeypatch):
    notebook_launcher(bare_rank, num_processes=2, display="none", start_method=start_method)  # server up
    monkeypatch.setenv("SET_IN_A_LATER_CELL", "yes")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path / "extra")])
    seen = notebook_launcher(environment_seen, num_processes=2, display="none", start_method=start_method,
                             return_all=True)
    assert seen == [("yes", str(tmp_path), str(tmp_path / "extra"), str(rank)) for rank in range(2)]


# ----------------------------------------------------------------------- 5: multiprocessing inside a rank

@pytest.mark.parametrize("start_method", START_METHODS)
def test_dataloader_workers_pickle_and_torch_save_with_notebook_defined_classes(start_method):
    out = ok_script(f"""
        import io, multiprocessing, pickle, torch
        from torch.utils.data import DataLoader, Dataset
        from notebook_accel import notebook_launcher

        class Squares(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, index):
                return torch.tensor([float(index * index)])

        def train():
            loader = DataLoader(Squares(), batch_size=4, num_workers=2,
                                collate_fn=lambda items: torch.cat(items))
            total = sum(batch.sum().item() for batch in loader)
            pickled = pickle.loads(pickle.dumps(Squares()))
            buffer = io.BytesIO()
            torch.save(Squares(), buffer)
            return total, type(pickled).__name__, multiprocessing.get_start_method()

        print("RESULT", notebook_launcher(train, num_processes=2, start_method={start_method!r},
                                          display="none", return_all=True))
    """)
    assert "RESULT [(140.0, 'Squares', 'fork'), (140.0, 'Squares', 'fork')]" in out


# ---------------------------------------------------------------------- 6: a process group in the kernel

def test_a_process_group_in_the_kernel_is_not_inherited():
    out = ok_script("""
        import torch, torch.distributed as dist
        from notebook_accel import notebook_launcher
        from notebook_accel.errors import LaunchConfigError
        store = dist.HashStore()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)   # an experiment cell
        def train():
            dist.init_process_group("gloo")
            total = torch.tensor([1.0])
            dist.all_reduce(total)
            return dist.get_world_size(), total.item()
        print("RESULT", notebook_launcher(train, num_processes=2, display="none"))
        try:
            notebook_launcher(train, num_processes=2, display="none", start_method="fork")
        except LaunchConfigError as error:
            print("REFUSED", error)
        dist.destroy_process_group()
        print("AFTER", notebook_launcher(train, num_processes=2, display="none", start_method="fork"))
    """)
    assert "RESULT (2, 2.0)" in out
    assert re.search(r"REFUSED notebook_launcher: start_method='fork' is not safe here: a torch.distributed process group "
                     r"\(backend gloo, world size 1\).*destroy_process_group\(\)", out), out
    assert "AFTER (2, 2.0)" in out


# ------------------------------------------------------------------ 7: a rank ends as a Python program

def leaves_a_writer_thread_and_an_atexit_handler(folder):
    import atexit

    rank = os.environ["RANK"]

    def write_later():
        time.sleep(1.0)
        with open(os.path.join(folder, f"thread-{rank}"), "w") as out:
            out.write("written after the function returned")

    threading.Thread(target=write_later, name="checkpoint-writer").start()
    atexit.register(lambda: open(os.path.join(folder, f"atexit-{rank}"), "w").close())
    return rank


@pytest.mark.parametrize("start_method", START_METHODS)
def test_non_daemon_threads_finish_and_atexit_runs(start_method, tmp_path):
    result = notebook_launcher(leaves_a_writer_thread_and_an_atexit_handler, args=(str(tmp_path),),
                               num_processes=2, display="none", start_method=start_method)
    assert result == "0"
    assert sorted(os.listdir(tmp_path)) == ["atexit-0", "atexit-1", "thread-0", "thread-1"]


def makes_the_group_and_returns():
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://, as a torchrun script does; no collective after it
    return dist.get_rank()


def test_a_rank_that_returns_right_after_making_the_group_does_not_fail_its_slower_peer():
    """gloo connects the pair inside init_process_group; a rank that returned and exited at once used to close the
    connection before its peer's main thread saw it made: "Connection closed by peer" in the peer, no rank at fault
    (a 2-rank launch in four on a busy 2-core machine; rank/leaving.py). The machine is made busy for the test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(6)]
    try:
        results = [notebook_launcher(makes_the_group_and_returns, num_processes=2, display="none", device="cpu",
                                     start_method="fork", return_all=True) for _ in range(24)]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert results == [[0, 1]] * 24


def never_ending_thread():
    threading.Thread(target=time.sleep, args=(120,), name="stuck-uploader").start()
    return "returned"


def test_threads_past_the_grace_period_are_named_and_the_rank_ends(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_EXIT_GRACE", "1")
    job = start_launch(never_ending_thread, num_processes=2, display="none", start_method="fork")
    assert job.wait(timeout=60) == "returned"
    stderr = "\n".join(job.outputs[0])
    assert "non-daemon thread(s) 'stuck-uploader' still run; ending the rank" in stderr


def exits_with(code):
    if os.environ["RANK"] == str(int(os.environ["WORLD_SIZE"]) - 1):
        sys.exit(code)
    time.sleep(0.5)
    return "rank 0 ended normally"


@pytest.mark.parametrize("ranks", [1, 2])
def test_sys_exit_zero_is_a_normal_end_and_sys_exit_n_a_failure_with_code_n(ranks):
    value = notebook_launcher(exits_with, args=(0,), num_processes=ranks, display="none")
    assert value == (None if ranks == 1 else "rank 0 ended normally")
    with pytest.raises(LaunchError, match=rf"rank {ranks - 1} called sys.exit\(3\)") as caught:
        notebook_launcher(exits_with, args=(3,), num_processes=ranks, display="none")
    assert caught.value.exitcode == 3 and caught.value.rank == ranks - 1


# -------------------------------------------------------------------- 8: scripts without a __main__ guard

@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_script_without_a_main_guard_runs_its_body_once(start_method, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os
        from notebook_accel import notebook_launcher
        print("BODY RAN", flush=True)
        def train():
            return int(os.environ["RANK"])
        print("RESULT", notebook_launcher(train, num_processes=2, start_method={start_method!r},
                                          display="none", return_all=True))
    """))
    done = subprocess.run([sys.executable, str(script)], env=script_env(), capture_output=True, text=True,
                          timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("BODY RAN") == 1 and "RESULT [0, 1]" in done.stdout


# ------------------------------------------------------------- 9: a CUDA driver opened by another library

def test_a_cuda_driver_initialized_by_another_library_makes_the_launch_use_the_fork_server(tmp_path):
    """No GPU here: the stand-in driver (tests/cuda_stand_in.py, a libcuda.so.1 with no device) is loaded, as
    torch's CUDA wheels load the real one at ``import torch``: fork stays safe. Once cupy or numba would have
    initialized it (``cuInit``), it is not."""
    import cuda_stand_in

    try:
        library = cuda_stand_in.build(str(tmp_path / "driver"))["libcuda.so.1"]
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"no C compiler to build the stand-in driver: {error}")
    out = ok_script(f"""
        import ctypes
        from notebook_accel.plan.plan import plan_launch
        from notebook_accel.errors import LaunchConfigError
        print("BEFORE", plan_launch(len, args=((),), num_processes=2).start_method)
        driver = ctypes.CDLL({library!r})
        print("LOADED", plan_launch(len, args=((),), num_processes=2).start_method)
        driver.cuInit(0)
        print("INITIALIZED", plan_launch(len, args=((),), num_processes=2).start_method)
        try:
            plan_launch(len, args=((),), num_processes=2, start_method="fork")
        except LaunchConfigError as error:
            print("REFUSED", error)
    """)
    assert "BEFORE fork" in out and "LOADED fork" in out and "INITIALIZED forkserver" in out, out
    assert "REFUSED start_method='fork' is not safe here: a CUDA driver is initialized in this process" in out


def test_a_second_cuda_driver_mapped_beside_the_first_is_asked_too(tmp_path):
    """Seen on a GPU machine: torch's CUDA build maps the system's ``libcuda.so.1`` at import, and a library that
    loads its own copy by path initializes that one. Fork is then unsafe, whichever of the two ``/proc/self/maps``
    lists first. Here both are stand-ins, and the one listed second is initialized."""
    import cuda_stand_in

    try:
        paths = [cuda_stand_in.build(str(tmp_path / name))["libcuda.so.1"] for name in ("a", "b")]
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"no C compiler to build the stand-in driver: {error}")
    out = ok_script(f"""
        import ctypes
        from notebook_accel.plan.devices import cuda_driver_initialized
        drivers = {{path: ctypes.CDLL(path) for path in {paths!r}}}
        print("BOTH MAPPED", cuda_driver_initialized())
        listed = [line.split()[-1] for line in open("/proc/self/maps") if "/libcuda.so" in line]
        drivers[[path for path in drivers if path != listed[0]][0]].cuInit(0)
        print("SECOND INITIALIZED", cuda_driver_initialized())
    """)
    assert "BOTH MAPPED False" in out and "SECOND INITIALIZED True" in out, out


# ------------------------------------------------------------------------ 10: the in-kernel rank's fds

def writes_at_every_level():
    print("python print")
    os.write(1, b"raw fd write\n")
    subprocess.run(["echo", "from a subprocess"], check=True)
    import ctypes

    libc = ctypes.CDLL(None)
    libc.printf(b"from C printf\n")
    return "done"


def open_file_identity(fd):
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def test_the_in_kernel_rank_captures_c_and_subprocess_output_and_restores_the_fds(capfd):
    from notebook_accel.launcher import Launch

    plan = plan_launch(writes_at_every_level, num_processes=1, display="none")
    assert plan.backend == "inline"
    kernel_fds = {fd: open_file_identity(fd) for fd in (1, 2)}  # capfd's files, as a kernel's would be its own
    launch = Launch(plan)
    assert launch.run() == "done"
    job_outputs = launch.outputs[0]
    for line in ("python print", "raw fd write", "from a subprocess", "from C printf"):
        assert line in job_outputs, job_outputs
    # The kernel's fds are its own again: the same files as before, and bytes written to them land there,
    # not in the finished launch's capture.
    assert {fd: open_file_identity(fd) for fd in (1, 2)} == kernel_fds
    capfd.readouterr()
    os.write(1, b"raw after the launch\n")
    os.write(2, b"raw stderr after the launch\n")
    print("printed after the launch", flush=True)
    after = capfd.readouterr()
    assert "raw after the launch" in after.out and "printed after the launch" in after.out
    assert "raw stderr after the launch" in after.err
    assert not any("after the launch" in line for line in launch.outputs[0])


# ------------------------------------------------------------------------ 11: where is each rank?

def stuck_in_a_collective_like_wait():
    if os.environ["RANK"] == "1":
        time.sleep(120)   # the rank that never arrives
    waiting_for_rank_one()


def waiting_for_rank_one():
    time.sleep(120)


def test_timeout_names_the_function_each_rank_is_stuck_in():
    with pytest.raises(LaunchTimeout) as caught:
        notebook_launcher(stuck_in_a_collective_like_wait, num_processes=2, display="none", timeout=4)
    assert sorted(caught.value.stacks) == [0, 1]
    assert "in waiting_for_rank_one" in caught.value.stacks[0]
    assert "in stuck_in_a_collective_like_wait" in caught.value.stacks[1]
    assert "Where they were:" in str(caught.value) and "in waiting_for_rank_one" in str(caught.value)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_dump_stacks_on_demand_shows_every_running_rank(start_method):
    job = start_launch(stuck_in_a_collective_like_wait, num_processes=2, display="none",
                       start_method=start_method)
    try:
        def stacks_once_both_wait():  # a rank may still be importing torch or starting (loaded machine): ask again
            stacks = job.dump_stacks()
            arrived = ("in waiting_for_rank_one" in stacks.get(0, "")
                       and "in stuck_in_a_collective_like_wait" in stacks.get(1, ""))
            return stacks if arrived else None

        stacks = wait_until(stacks_once_both_wait, timeout=60, interval=0.5,
                            what="rank 0 in waiting_for_rank_one and rank 1 in stuck_in_a_collective_like_wait")
        assert sorted(stacks) == [0, 1]
        assert "in waiting_for_rank_one" in stacks[0]
        assert "in stuck_in_a_collective_like_wait" in stacks[1]
    finally:
        job.stop()
        with pytest.raises(KeyboardInterrupt):
            job.wait(timeout=60)


# --------------------------------------------------------------------------------- 12: other platforms

def test_import_and_spawn_launch_work_without_fcntl_and_fork_is_refused_on_macos():
    out = ok_script("""
        import sys
        sys.modules["fcntl"] = None          # as on Windows: importing it fails
        import notebook_accel
        from notebook_accel import notebook_launcher
        import notebook_accel.backends.processes
        print("RESULT", notebook_launcher(lambda: 7, num_processes=2, start_method="spawn", display="none"))
        sys.platform = "darwin"
        from notebook_accel.errors import LaunchConfigError
        try:
            notebook_launcher(lambda: 7, num_processes=2, start_method="fork", display="none")
        except LaunchConfigError as error:
            print("REFUSED", error)
        from notebook_accel.plan.plan import plan_launch
        print("AUTO", plan_launch(lambda: 7, num_processes=2).start_method)
    """)
    assert "RESULT 7" in out
    assert "REFUSED notebook_launcher: start_method='fork' is not safe here: on macOS" in out
    assert "AUTO forkserver" in out


NOTEBOOK_CLASSES = """
import os
from dataclasses import dataclass
from notebook_accel import notebook_launcher

class BadBatch(Exception):
    pass

@dataclass
class Result:
    rank: int

def fails():
    if os.environ["RANK"] == "1" or os.environ["WORLD_SIZE"] == "1":
        raise BadBatch("bad batch")
    import time; time.sleep(30)

def returns():
    return Result(int(os.environ["RANK"]))

for how in ({start}):
    try:
        notebook_launcher(fails, display="none", **how)
    except BadBatch as caught:
        print("CAUGHT", how, type(caught) is BadBatch)
    results = notebook_launcher(returns, display="none", return_all=True, **how)
    print("RESULT", how, [isinstance(result, Result) for result in results], [result.rank for result in results])
"""


@pytest.mark.parametrize("start", ["dict(num_processes=2, start_method='fork')",
                                   "dict(num_processes=2, start_method='forkserver')",
                                   "dict(num_processes=2, start_method='spawn')",
                                   "dict(num_processes=1)"])  # the in-kernel rank
def test_notebook_classes_come_back_as_the_notebooks_own(start):
    # A notebook's exception class must be caught by `except` and its result class pass isinstance: the
    # rank sends them by name, so the kernel resolves its own class (a copy by value would be another class).
    out = ok_script(NOTEBOOK_CLASSES.replace("{start}", start + ","))
    how = eval(start)
    assert f"CAUGHT {how} True" in out, out
    ranks = how["num_processes"]
    assert f"RESULT {how} {[True] * ranks} {list(range(ranks))}" in out, out


def test_a_scripts_traceback_shows_the_ranks_frames_first_and_one_launcher_line():
    done = run_script("""
from notebook_accel import notebook_launcher
def fails():
    import os, time
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch")
    time.sleep(30)
notebook_launcher(fails, num_processes=2, display="none")
""")
    assert done.returncode == 1
    remote, _, kernel = done.stderr.partition("The above exception was the direct cause")
    assert "[rank 1] Traceback" in remote and 'line 6, in fails' in remote
    ours = [line for line in kernel.splitlines() if line.strip().startswith("File ") and "notebook_accel" in line]
    assert len(ours) == 1 and "in notebook_launcher" in ours[0], kernel  # Launch.run / Launch.wait folded
    assert kernel.rstrip().splitlines()[-2] == "ValueError: bad batch"
