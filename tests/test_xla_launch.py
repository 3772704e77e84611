"""TPU launches on a fake TPU host: the fake torch_xla (tests/fake_torch_xla, mirroring torch_xla 2.9's
xmp.spawn: worker processes × device threads, blocking collectives) and a fake sysfs (tests/fake_tpu.py).
There is no TPU here; what these tests check is ours: results by ordinal, root cause, stop, output labels.
The same launches on the real torch_xla (CPU client) are in test_xla_real.py (marked ``xla``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import torch
import pytest

from fake_tpu import become_tpu_host, tpu_host_env
from notebook_accel import LaunchError
from notebook_accel.wire.events import MetricReport, OutputLine, ProgressUpdate, RankExited, RankStarted
from notebook_accel.launcher import start_launch
from scripts import Recorder

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def tpu_host(monkeypatch, tmp_path):
    def become(name: str) -> None:
        become_tpu_host(monkeypatch, str(tmp_path / "sysfs"), name)
    return become


def running(pid: int, wait: float = 5.0) -> bool:
    """Still running after ``wait`` s (a killed worker may stay a zombie until init reaps it: not running)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def launch(function, *args, **options):
    recorder = Recorder()
    job = start_launch(function, args, view=recorder, device="xla", **options)
    try:
        return job.wait(120), recorder
    except BaseException as error:
        error.recorder = recorder
        raise


# ------------------------------------------------------------------------------------ launched functions

def ordinal_and_pid(scale):
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    total = xm.all_reduce(xm.REDUCE_SUM, torch.ones(1) * (xr.global_ordinal() + 1)).item()
    return xr.global_ordinal() * scale, xr.world_size(), total, os.getpid()


def talks_and_counts():
    import torch_xla.runtime as xr
    from tqdm import tqdm

    from notebook_accel import report

    rank = xr.global_ordinal()
    print(f"python-level from rank {rank}")
    os.write(2, f"C-level from pid {os.getpid()}\n".encode())
    for step in tqdm(range(40), desc=f"device {rank}"):
        report(step=step, ordinal=rank)  # throttled per rank, though the ranks share a process


def one_rank_raises_peers_block():
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 5:
        time.sleep(0.5)
        raise KeyError("rank five lost its key")
    xm.all_reduce(xm.REDUCE_SUM, torch.ones(1))  # blocks for ever without rank 5 (pytorch/xla#7974)


def worker_segfaults():
    import ctypes

    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 2:
        time.sleep(1)
        ctypes.string_at(0)
    xm.all_reduce(xm.REDUCE_SUM, torch.ones(1))


def cache_directory():
    return os.environ.get("XLA_PERSISTENT_CACHE_PATH")


# ----------------------------------------------------------------------------------------------- tests

def test_results_by_global_ordinal_over_processes_and_threads(tpu_host):
    tpu_host("v2-8")  # 4 chips: 4 worker processes × 2 device threads
    results, recorder = launch(ordinal_and_pid, 10, return_all=True)
    assert [value for value, _, _, _ in results] == [rank * 10 for rank in range(8)]
    assert all(world == 8 and total == 36 for _, world, total, _ in results)  # the collective agreed
    pids = [pid for _, _, _, pid in results]
    assert len(set(pids)) == 4 and pids[0] == pids[1] and pids[6] == pids[7] and os.getpid() not in pids
    assert sorted(event.rank for event in recorder.of(RankStarted)) == list(range(8))
    assert all(event.exitcode == 0 and not event.stopped for event in recorder.of(RankExited))


@pytest.mark.parametrize("host, world", [("v5e-1", 1), ("v5e-8", 8)])
def test_one_and_every_device(tpu_host, host, world):
    tpu_host(host)
    (value, size, total, pid), _ = launch(ordinal_and_pid, 1)
    assert (value, size, total) == (0, world, world * (world + 1) / 2)
    assert pid != os.getpid()  # one device runs in the host process, never in the kernel
    results, _ = launch(ordinal_and_pid, 1, num_processes=1, return_all=True)
    assert [(value, size) for value, size, _, _ in results] == [(0, 1)]


def test_output_and_progress_per_thread(tpu_host):
    tpu_host("v2-8")
    _, recorder = launch(talks_and_counts)
    lines = recorder.of(OutputLine)
    for rank in range(8):
        assert ("stdout", f"python-level from rank {rank}") in [(l.stream, l.text) for l in lines if l.rank == rank]
        bars = [update for update in recorder.of(ProgressUpdate) if update.rank == rank]
        assert bars and bars[-1].closed and bars[-1].n == 40 and bars[-1].desc == f"device {rank}"
        reports = [event for event in recorder.of(MetricReport) if event.rank == rank]
        assert reports and {event.metrics["ordinal"] for event in reports} == {rank}
        assert reports[-1].step == 39  # the held-back last value was delivered
    c_level = [line for line in lines if line.text.startswith("C-level from pid")]
    # fds 1/2 are per process: a process's C-level output carries its first device's rank
    assert len(c_level) == 8 and {line.rank for line in c_level} == {0, 2, 4, 6}
    for rank in (0, 2, 4, 6):
        assert len({line.text for line in c_level if line.rank == rank}) == 1


def test_one_rank_raises_while_its_peers_block(tpu_host):
    tpu_host("v2-8")
    started = time.monotonic()
    with pytest.raises(KeyError, match="rank five lost its key") as raised:
        launch(one_rank_raises_peers_block)
    assert raised.value.rank == 5
    assert time.monotonic() - started < 60, "the blocked peers were not stopped"
    exits = raised.value.recorder.of(RankExited)
    assert {event.rank for event in exits if event.stopped} == set(range(8)) - {5}
    assert [event.exitcode for event in exits if event.rank == 5] == [1]


def test_a_segfaulting_worker_is_a_launch_error(tpu_host):
    tpu_host("v5e-8")  # one device per worker process: the dead rank is known exactly
    with pytest.raises(LaunchError, match="rank 2 was killed by SIGSEGV") as raised:
        launch(worker_segfaults)
    assert raised.value.signal_name == "SIGSEGV"
    assert "its last output" in str(raised.value)
    rank2 = [line.text for line in raised.value.recorder.of(OutputLine) if line.rank == 2]
    assert "Fatal Python error: Segmentation fault" in rank2  # faulthandler's, on the worker's own stderr
    started = {event.rank: event.pid for event in raised.value.recorder.of(RankStarted)}
    assert 2 in started and len(set(started.values())) == len(started)  # a process per device on v5e
    assert not any(running(pid) for pid in started.values())


def test_compile_cache_is_per_worker_process(tpu_host, tmp_path):
    tpu_host("v5e-8")
    results, _ = launch(cache_directory, return_all=True, compile_cache=str(tmp_path / "cache"))
    assert results == [str(tmp_path / "cache" / f"process-{rank}") for rank in range(8)]
    assert sorted(os.listdir(tmp_path / "cache")) == [f"process-{rank}" for rank in range(8)]


def test_kernel_never_imports_torch_xla_and_launches_again(tmp_path):
    code = """
import sys
from notebook_accel import notebook_launcher
from notebook_accel.plan import devices as environment
def where():
    import os, torch_xla.runtime as xr
    return xr.global_ordinal(), os.getpid()
first = notebook_launcher(where, return_all=True, display="none")
second = notebook_launcher(where, return_all=True, display="none")
print("RANKS", [r for r, _ in first], [r for r, _ in second])
print("KERNEL", "torch_xla" in sys.modules, environment.fork_safety()[0])
"""
    env = tpu_host_env(str(tmp_path), "v5e-8")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    assert "RANKS [0, 1, 2, 3, 4, 5, 6, 7] [0, 1, 2, 3, 4, 5, 6, 7]" in out.stdout
    assert "KERNEL False True" in out.stdout


def test_interrupt_leaves_no_process(tmp_path):
    """Jupyter's interrupt is SIGINT to the kernel: every worker and the host go, KeyboardInterrupt is raised."""
    code = """
import os, time, psutil
from notebook_accel import notebook_launcher
def blocks():
    import torch, torch_xla.core.xla_model as xm, torch_xla.runtime as xr
    print("WORKER", os.getpid(), flush=True)
    if xr.global_ordinal() != 0:
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(1))  # rank 0 never joins: everyone else blocks
    time.sleep(120)
try:
    notebook_launcher(blocks, display="text")
except KeyboardInterrupt:
    kept = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")  # warm helpers, by design
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if not any(k in " ".join(p.cmdline()) for k in kept)]
    print("INTERRUPTED", left, flush=True)
"""
    env = tpu_host_env(str(tmp_path), "v2-8")
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    workers, seen = set(), []
    reader = threading.Thread(target=lambda: seen.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while len(workers) < 4 and time.monotonic() < deadline:
        workers = {int(line.split()[-1]) for line in list(seen) if "WORKER" in line}
        time.sleep(0.2)
    assert len(workers) == 4, "".join(seen)
    process.send_signal(signal.SIGINT)
    process.wait(60)
    reader.join(10)
    assert "INTERRUPTED []" in "".join(seen), "".join(seen)
    assert not any(running(pid) for pid in workers)


@pytest.mark.parametrize("host, precision", [("cpu-client", "no"), ("v5e-2", "bf16")])
def test_the_seeds_transformer_trains_with_the_accelerator_on_xla(tpu_host, monkeypatch, host, precision):
    """2 device threads of one process (the CPU client's shape, and v2/v3's) or 2 processes (v5e)."""
    from xla_examples import transformer_example

    if host == "cpu-client":
        tpu_host("none")
        monkeypatch.setenv("PJRT_DEVICE", "CPU")
        monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    else:
        tpu_host(host)
    results, _ = launch(transformer_example, return_all=True, mixed_precision=precision)
    first, second = results
    assert [first["rank"], second["rank"]] == [0, 1] and first["world"] == 2
    assert first["kind"] == "XLA" and first["precision"] == precision
    assert first["loader"] == "XlaDeviceLoader"  # torch_xla's MpDeviceLoader over the shard
    assert first["ranks"] == [0, 1] and first["objects"] == ["rank 0", "rank 1"]
    assert first["losses"] == second["losses"] and len(first["losses"]) == 4 * 64 // 16
    assert sum(first["losses"][-4:]) < 0.8 * sum(first["losses"][:4]), first["losses"]  # it learns
    for name, value in first["weights"].items():  # XLA's gradient all-reduce kept the replicas identical
        assert torch.equal(value, second["weights"][name]), name


def test_a_function_that_cannot_be_loaded_in_the_host_is_named(tpu_host):
    tpu_host("v5e-2")

    class Unloadable:
        def __reduce__(self):
            return (_refuse_to_load, ())

    with pytest.raises(ImportError, match="cannot be loaded on the TPU host") as raised:
        launch(lambda value: value, Unloadable())
    assert raised.value.rank == 0


def _refuse_to_load():
    raise ImportError("cannot be loaded on the TPU host")


def test_notebook_classes_come_back_as_the_notebooks_own_from_tpu_cores(tmp_path):
    # The host gets the function by value and registers the notebook's classes in its __main__; the cores'
    # results and exceptions name them, so `except` and isinstance match the notebook's own classes.
    code = """
from dataclasses import dataclass
from notebook_accel import notebook_launcher

class BadCore(Exception):
    pass

@dataclass
class Result:
    ordinal: int

def returns():
    import torch_xla.runtime as xr
    return Result(xr.global_ordinal())

def fails():
    import torch_xla.runtime as xr
    if xr.global_ordinal() == 3:
        raise BadCore("core 3")
    import time; time.sleep(30)

results = notebook_launcher(returns, return_all=True, display="none")
print("RESULTS", all(isinstance(result, Result) for result in results), [r.ordinal for r in results])
try:
    notebook_launcher(fails, display="none")
except BadCore as caught:
    print("CAUGHT", type(caught) is BadCore, caught.rank)
"""
    env = tpu_host_env(str(tmp_path), "v4-8")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "RESULTS True [0, 1, 2, 3]" in out.stdout, out.stdout
    assert "CAUGHT True 3" in out.stdout, out.stdout


@pytest.mark.parametrize("host", ["cpu-client", "v5e-2"])
def test_uneven_data_on_xla_counts_the_users_batches_not_the_prefetchers(tpu_host, monkeypatch, host):
    """The fake MpDeviceLoader prefetches in a thread as torch_xla 2.9's does (up to 24 batches ahead), so the
    prepared loader's look-ahead runs ahead of the batch the user holds. Seen on the real CPU client: the last
    accumulation cycle never synced, and gather_for_metrics read the wrong step's layout."""
    from xla_examples import uneven_epoch_example

    if host == "cpu-client":
        tpu_host("none")
        monkeypatch.setenv("PJRT_DEVICE", "CPU")
        monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    else:
        tpu_host(host)
    results, _ = launch(uneven_epoch_example, 21, 2, 4, return_all=True)
    for result in results:
        # 21 samples over 2 ranks in batches of 2: 6 batches each (the last one padded on one rank)
        assert result["world"] == 2 and result["batches"] == 6
        assert result["gathered"] == [float(value) for value in range(21)], result
        assert result["syncs"] == [4, 6], result


def graph_cuts():
    import torch
    import torch_xla
    import torch_xla._fake_runtime as fake_runtime  # the fake's record of this thread's cuts and collectives
    import torch_xla.core.xla_model as xm

    for _ in range(5):
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(2, device=torch_xla.device()))
        torch_xla.sync()
    xm.mark_step(wait=True)  # a waiting cut: waits for its own device by its real name
    return fake_runtime.thread_events(), fake_runtime.overlapping_cuts


@pytest.mark.parametrize("host", ["cpu-client", "v2-8", "v5e-2"])
def test_graph_cuts_are_serialized_on_the_cpu_client_only(tpu_host, monkeypatch, host):
    """On XLA's CPU client every cut is taken one device thread at a time and each collective gets a graph of
    its own (rank/xla/cpu_client.py); on a TPU, with device threads (v2) or without (v5e), nothing changes."""
    if host == "cpu-client":
        tpu_host("none")
        monkeypatch.setenv("PJRT_DEVICE", "CPU")
        monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    else:
        tpu_host(host)
    results, _ = launch(graph_cuts, return_all=True)
    for events, overlapping in results:
        if host == "cpu-client":
            assert events == ["step_marker", "all_reduce", "step_marker", "step_marker"] * 5 + ["step_marker"]
            assert overlapping == 0  # the fake's cuts take time: unserialized threads would overlap
        else:
            assert events == ["all_reduce", "step_marker"] * 5 + ["step_marker"]
