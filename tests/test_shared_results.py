"""Data back from the ranks through shared memory (issue 29 §1): ``Session.pull``, ``Session.run`` and launch
return values bring large tensors and numpy arrays back as the kernel's own memory, mapped, not copied.

What is checked: the same values come back (dtype, shape, strides, views of one storage, numpy arrays, nested in
dicts and lists) under fork, forkserver and spawn; the kernel's tensor lies in a shared-memory mapping of its own;
a rank that changes its tensor after ``pull`` does not change the kernel's, nor the kernel the rank's; nothing is
left in /dev/shm, among the kernel's fds or its mappings (also when a rank is killed while it sends). Time is
bounded loosely (a hang, not a slow machine); the speed against Ray's object store is benchmarks/bench_session.py's.
"""
from __future__ import annotations

import gc
import os
import re
import signal
import sys
import textwrap
import threading
import time

import numpy
import pytest
import torch

from notebook_accel import Session, notebook_launcher
from notebook_accel.errors import LaunchError
from notebook_accel.rank.run import to_cpu

from scripts import start_script

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps and fd")]

START_METHODS = ["fork", "forkserver", "spawn"]
RESULT_FILE = "notebook_accel-result"   # the name our shared-memory files carry (``wire.results``)


def notebook_cell(source: str) -> dict:
    """Functions as a notebook defines them (in ``__main__``): they travel by value, as from a Jupyter kernel."""
    namespace = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "<test cell>", "exec"), namespace)
    return namespace


CELL = notebook_cell("""
    import os

    def make_values(rank):
        import numpy
        import torch

        base = torch.arange(384 * 1024, dtype=torch.float32).reshape(384, 1024) + rank   # 1.5 MiB
        return {
            "tensor": base,
            "transposed": base.t(),                         # not contiguous
            "rows": base[10:20],                            # a view at an offset into its storage
            "one_storage": [base, base[1]],                 # two views of one storage stay one storage
            "bf16": torch.full((100_000,), rank + 0.5, dtype=torch.bfloat16),
            "int": torch.arange(100_000, dtype=torch.int64) * (rank + 1),
            "small": torch.ones(3) * rank,                  # under the shared-memory threshold: in the pickle
            "parameter": torch.nn.Parameter(torch.full((100_000,), float(rank))),
            "array": numpy.arange(200_000, dtype=numpy.float64) + rank,
            "strided_array": (numpy.arange(400_000.0) + rank)[::2],   # not contiguous: in the pickle
            "nested": {"list": [torch.full((50_000,), 7.0 + rank), (numpy.ones(30_000) * rank, "text")]},
        }

    def keep_values():
        global values, big
        rank = int(os.environ["RANK"])
        values = make_values(rank)
        big = values["tensor"]

    def return_values():
        return make_values(int(os.environ["RANK"]))

    def bump_big():
        big.add_(1000)            # in place: the storage the kernel pulled from
        return float(big[0, 0])

    def big_value():
        return float(big[0, 0])

    def one():
        return 1

    def many_tensors(count):
        import torch

        return {f"t{index}": torch.full((1 << 14,), float(index)) for index in range(count)}   # 64 KiB each

    def gathered(megabytes):
        from notebook_accel import Accelerator
        from notebook_accel.accelerator.operations import gather_object

        accelerator = Accelerator()
        mine = torch_full(megabytes, accelerator.process_index)
        return {"gather": accelerator.gather(mine), "gather_object": gather_object(mine[:4].clone())}

    def torch_full(megabytes, value):
        import torch

        return torch.full((megabytes << 18,), float(value))

    def big_then_fail(marker, megabytes):
        import time

        if int(os.environ["RANK"]) == 0:
            open(marker, "w").close()       # just before its result goes: rank 1 fails once it is sent
            return torch_full(megabytes, 3)
        while not os.path.exists(marker):
            time.sleep(0.01)
        time.sleep(1.0)
        raise ValueError("rank 1 fails after rank 0 returned")

    def returns_big_and_slow(megabytes):
        import torch

        # the tensor goes through shared memory; the bytes make the pickle long, so the kernel holds the
        # tensor's file while the rest of the result is still on its way
        return {"tensor": torch.ones(megabytes << 18), "padding": bytes(300 << 20)}
""")
make_values, keep_values, return_values = CELL["make_values"], CELL["keep_values"], CELL["return_values"]
bump_big, big_value, one = CELL["bump_big"], CELL["big_value"], CELL["one"]
returns_big_and_slow, many_tensors = CELL["returns_big_and_slow"], CELL["many_tensors"]
gathered, big_then_fail = CELL["gathered"], CELL["big_then_fail"]


def assert_same(got, expected, where="value"):
    """``got`` equals ``expected`` in type, dtype, shape, strides and content, at every depth."""
    assert type(got) is type(expected), where
    if isinstance(expected, torch.Tensor):
        assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == \
            (expected.dtype, expected.shape, expected.stride(), expected.storage_offset()), where
        assert torch.equal(got, expected), where
    elif isinstance(expected, numpy.ndarray):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), where
        assert numpy.array_equal(got, expected), where
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for index, (one, other) in enumerate(zip(got, expected)):
            assert_same(one, other, f"{where}[{index}]")
    else:
        assert got == expected, where


def expected_values(rank):
    """What rank ``rank`` returns, as the kernel gets it: tensors detached (a parameter as a plain tensor)."""
    return to_cpu(make_values(rank))


def assert_values(results):
    assert len(results) == 2
    for rank, got in enumerate(results):
        assert_same(got, expected_values(rank), f"rank {rank}")
        assert got["one_storage"][0].untyped_storage().data_ptr() == \
            got["one_storage"][1].untyped_storage().data_ptr()


def result_mappings():
    """The kernel's mappings of our result files: (start, end) address ranges."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if RESULT_FILE in line:
                start, end = (int(part, 16) for part in line.split()[0].split("-"))
                found.append((start, end))
    return found


def result_fds():
    """The kernel's open fds that are our result files."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if RESULT_FILE in os.readlink(f"/proc/self/fd/{name}"):
                found.append(int(name))
        except OSError:
            pass
    return found


def in_a_result_mapping(address: int) -> bool:
    return any(start <= address < end for start, end in result_mappings())


def dev_shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def left_in_dev_shm(before: set) -> set:
    """The /dev/shm entries made since ``before`` by this process or by one that has ended: what this test left.

    pytest-xdist runs other files beside this one, and their live ranks make and remove torch's
    ``torch_<pid>_...`` entries while this test runs (CI once saw one go between before and after). An entry of
    another live process is theirs; one whose maker has ended is a leak, whoever made it; a name without a pid
    counts as a leak too."""
    def maker_is_gone_or_us(name: str) -> bool:
        maker = re.match(r"torch_(\d+)_", name)
        if maker is None:
            return True
        pid = int(maker.group(1))
        return pid == os.getpid() or is_zombie(pid)     # is_zombie: also when the process is gone
    return {name for name in dev_shm() - before if maker_is_gone_or_us(name)}


# ----------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("start_method", START_METHODS)
def test_pull_and_run_bring_back_the_same_values(start_method):
    with Session(num_processes=2, start_method=start_method, display="none") as session:
        session.run(keep_values)
        assert_values(session.pull("values"))
        assert_values(session.run(return_values, return_all=True))
        assert_same(session.run(return_values), expected_values(0))   # rank 0's alone, by default


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_launch_returns_the_same_values(start_method):
    assert_values(notebook_launcher(return_values, num_processes=2, start_method=start_method, return_all=True,
                                    display="none"))


def test_large_values_arrive_as_shared_memory_the_kernel_alone_maps_and_frees():
    shm_before = dev_shm()
    with Session(num_processes=2, display="none") as session:
        session.run(keep_values)
        pulled = session.pull("values")
        for values in pulled:
            # mapped where the rank's copy arrived: no copy in the kernel
            assert in_a_result_mapping(values["tensor"].data_ptr())
            assert in_a_result_mapping(values["array"].ctypes.data)
            assert in_a_result_mapping(values["nested"]["list"][0].data_ptr())
            assert not in_a_result_mapping(values["small"].data_ptr())   # small: in the pickle
        assert result_fds() == []      # the mappings alone hold the memory
        del pulled, values
        session.run(one)   # ``last_launch()`` keeps the last run's result: now this one's
        gc.collect()
        assert result_mappings() == []   # freed with the values, as a tensor's own memory is
        launched = notebook_launcher(return_values, num_processes=2, return_all=True, display="none")
        assert in_a_result_mapping(launched[1]["tensor"].data_ptr())  # the ranks are gone, the memory is ours
        assert float(launched[1]["tensor"][0, 0]) == 1.0
        del launched
        session.run(one)
        gc.collect()
        assert result_mappings() == []
    assert left_in_dev_shm(shm_before) == set()
    assert result_fds() == []


def test_more_large_tensors_than_one_message_carries_files():
    from notebook_accel.wire.results import FILES_PER_RESULT

    count = FILES_PER_RESULT + 50   # some files then hold two tensors
    with Session(num_processes=1, display="none") as session:
        state = session.run(many_tensors, args=(count,))
        assert [float(state[f"t{index}"][0]) for index in range(count)] == [float(index) for index in range(count)]
        assert all(in_a_result_mapping(tensor.data_ptr()) for tensor in state.values())
        assert result_fds() == []
        del state
        session.run(one)
        gc.collect()
        assert result_mappings() == []


def test_a_rank_that_changes_its_tensor_after_pull_does_not_change_the_kernels():
    with Session(num_processes=2, start_method="forkserver", display="none") as session:
        session.run(keep_values)
        pulled = [values["tensor"] for values in session.pull("values")]
        assert session.run(bump_big, return_all=True) == [1000.0, 1001.0]   # the ranks change theirs in place
        assert [float(tensor[0, 0]) for tensor in pulled] == [0.0, 1.0]       # the kernel's: as pulled
        for tensor in pulled:
            tensor.mul_(0)                                                    # and the kernel changes its own
        assert session.run(big_value, return_all=True) == [1000.0, 1001.0]   # the ranks' stay theirs
        again = session.pull("big")
        assert [float(tensor[0, 0]) for tensor in again] == [1000.0, 1001.0]
        assert again[0].data_ptr() != pulled[0].data_ptr()                    # each pull is a copy of its own


def test_a_rank_killed_while_sending_leaves_nothing_behind():
    shm_before = dev_shm()
    seen_mid_send = threading.Event()
    done = threading.Event()
    with Session(num_processes=1, display="none") as session:
        pid = session.pids[0]

        def kill_when_the_file_arrives():
            while not done.is_set():
                if result_fds():   # the tensor's file is here, the rest of the result is not
                    seen_mid_send.set()
                    os.kill(pid, signal.SIGKILL)
                    return
                time.sleep(0.001)

        killer = threading.Thread(target=kill_when_the_file_arrives)
        killer.start()
        try:
            with pytest.raises(LaunchError):
                session.run(returns_big_and_slow, args=(64,))
        finally:
            done.set()
            killer.join()
        assert seen_mid_send.is_set()
        assert result_fds() == []
        gc.collect()
        assert result_mappings() == []
        assert session.run(one) == 1   # the session started its rank again
    assert left_in_dev_shm(shm_before) == set()


POOL_CELL = notebook_cell("""
    def filled(value, megabytes):
        import torch

        return torch.full((megabytes << 18,), float(value))


    def pool_state():
        from notebook_accel.wire.channel import rank_channel

        pool = rank_channel().result_pool
        return {"reused": pool.reused, "files": len(pool.files),
                "free MiB": sum(pooled.capacity for pooled in pool.files if not pooled.lent()) >> 20}
""")
filled, pool_state = POOL_CELL["filled"], POOL_CELL["pool_state"]


def full(value, megabytes=4):
    return torch.full((megabytes << 18,), float(value))


def test_a_warm_rank_writes_a_result_into_memory_the_kernel_gave_back_never_into_what_it_holds():
    with Session(num_processes=1, display="none") as session:
        first = session.run(filled, args=(1, 4))
        second = session.run(filled, args=(2, 4))          # the first is held: a file of its own
        assert session.run(pool_state)["reused"] == 0
        del first
        gc.collect()                                       # the kernel gives the first's memory back...
        third = session.run(filled, args=(3, 4))           # ...and the rank writes the third there
        assert session.run(pool_state) == {"reused": 1, "files": 2, "free MiB": 0}
        assert torch.equal(second, full(2)) and torch.equal(third, full(3))
        third.fill_(9)                                     # the kernel's own, in the pooled file
        fourth = session.run(filled, args=(4, 4))          # both files are held: a third one
        assert torch.equal(third, full(9)) and torch.equal(second, full(2)) and torch.equal(fourth, full(4))
        assert session.run(pool_state)["files"] == 3
        del second, third, fourth
        gc.collect()
        assert result_mappings() == []                     # the kernel maps nothing once its values are freed


def test_a_warm_rank_keeps_at_most_its_limit_of_returned_memory(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_RESULT_POOL_MIB", "6")
    with Session(num_processes=1, display="none") as session:
        held = [session.run(filled, args=(value, 4)) for value in range(3)]   # three files lent
        del held
        session.run(one)  # ``last_launch()`` keeps the last run's result: now this one's
        gc.collect()                                       # 12 MiB free in the rank's pool now
        again = session.run(filled, args=(7, 4))           # one reused; the free ones beyond 6 MiB closed
        assert torch.equal(again, full(7))
        assert session.run(pool_state) == {"reused": 1, "files": 2, "free MiB": 4}


def test_pulling_200_mb_takes_well_under_a_slow_machines_bound():
    with Session(num_processes=2, display="none") as session:
        session.run(notebook_cell("""
            def make(count):
                import torch
                global big
                big = torch.ones(count)
        """)["make"], args=(25 << 20,))
        started = time.monotonic()
        pulled = session.pull("big")
        elapsed = time.monotonic() - started
        assert [tensor.shape[0] for tensor in pulled] == [25 << 20] * 2
        assert elapsed < 20.0, f"pulling 2 x 100 MiB took {elapsed:.1f} s"


def test_gathered_results_come_back_the_same_through_shared_memory():
    results = notebook_launcher(gathered, args=(2,), num_processes=2, return_all=True, display="none")
    expected = torch.cat([torch.full((2 << 18,), 0.0), torch.full((2 << 18,), 1.0)])
    for rank, result in enumerate(results):
        assert_same(result["gather"], expected, f"rank {rank}'s gather")
        assert in_a_result_mapping(result["gather"].data_ptr())
        assert_same(result["gather_object"], [torch.zeros(4), torch.ones(4)], f"rank {rank}'s gather_object")
    assert results[0]["gather"].data_ptr() != results[1]["gather"].data_ptr()   # each rank's copy its own
    del results, result
    notebook_launcher(one, num_processes=1, display="none")   # ``last_launch()`` now keeps this one
    gc.collect()
    assert result_mappings() == []


def test_a_failed_launch_frees_the_results_that_came_back(tmp_path):
    shm_before = dev_shm()
    with pytest.raises(ValueError, match="rank 1 fails"):
        notebook_launcher(big_then_fail, args=(str(tmp_path / "returned"), 16), num_processes=2, display="none")
    assert (tmp_path / "returned").exists()
    assert result_fds() == []
    notebook_launcher(one, num_processes=1, display="none")   # ``last_launch()`` now keeps this one
    gc.collect()
    assert result_mappings() == []
    assert left_in_dev_shm(shm_before) == set()


KERNEL_THAT_EXITS = """
    import os, signal, torch
    from notebook_accel import Session, notebook_launcher

    def make():
        global big
        big = torch.ones(4 << 20)

    def give():
        return torch.ones(4 << 20)

    session = Session(num_processes=2, display="none")
    session.run(make)
    pulled = session.pull("big")
    launched = notebook_launcher(give, num_processes=2, return_all=True, display="none")
    mapped = sum("notebook_accel-result" in line for line in open("/proc/self/maps"))
    print("ranks", *session.pids, "mapped", mapped, flush=True)
    if {kill}:
        os.kill(os.getpid(), signal.SIGKILL)    # the kernel killed while it holds the values and its ranks
    # else: the kernel exits with the session open and the values alive
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_kernel_that_ends_holding_results_leaves_nothing_behind(how):
    shm_before = dev_shm()
    kernel = start_script(KERNEL_THAT_EXITS.format(kill=how == "kill"))
    out, err = kernel.communicate(timeout=240)
    words = out.split()
    assert words[:1] == ["ranks"], err
    ranks = [int(word) for word in words[1:3]]
    assert int(words[4]) >= 4, out     # 2 pulled and 2 returned tensors were mapped in that kernel
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{pid}") and not is_zombie(pid) for pid in ranks):
        assert time.monotonic() < deadline, f"ranks {ranks} outlived their kernel"
        time.sleep(0.05)
    assert left_in_dev_shm(shm_before) == set()


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ------------------------------------------------------------------- a GPU rank's tensor, copied into the result

def test_a_device_tensors_chunks_cover_it_once_in_order():
    from notebook_accel.wire.results import CHUNK_BYTES, chunk_bounds

    assert chunk_bounds(0) == []
    assert chunk_bounds(CHUNK_BYTES) == [(0, CHUNK_BYTES)]
    bounds = chunk_bounds(2 * CHUNK_BYTES + 3)
    assert bounds == [(0, CHUNK_BYTES), (CHUNK_BYTES, 2 * CHUNK_BYTES), (2 * CHUNK_BYTES, 2 * CHUNK_BYTES + 3)]


@pytest.mark.parametrize("nbytes, chunk", [(10 * 4096 + 12, 4096), (3 << 20, 1 << 20), (5, 64 << 20)])
def test_a_device_storage_is_copied_by_chunks_into_the_shared_file_and_read_back_whole(nbytes, chunk, monkeypatch):
    """The route of a CUDA storage (``_DeviceSource``: copied by ``copy_from_device``, not from host memory), with a
    CPU storage standing in for want of a GPU: torch copies it by the same ``copy_`` of each chunk. Chunk sizes
    that do and do not divide it; the kernel's mapping holds every byte once, in order."""
    import torch

    from notebook_accel.wire import results

    monkeypatch.setattr(results, "CHUNK_BYTES", chunk)
    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    seen = []
    original = torch.Tensor.copy_

    def counting_copy(self, other, non_blocking=False):
        seen.append(other.numel())
        return original(self, other, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    fd = results.shared_memory_file(-(-nbytes // 4096) * 4096, "test")
    try:
        results._write(fd, results._DeviceSource(source.untyped_storage()), 0)
        monkeypatch.setattr(torch.Tensor, "copy_", original)
        back = torch.frombuffer(results.map_shared(fd, 0, nbytes), dtype=torch.uint8)
    finally:
        os.close(fd)
    assert seen == [stop - start for start, stop in results.chunk_bounds(nbytes, chunk)]
    assert torch.equal(back, source)


def test_a_warm_ranks_pool_takes_a_device_storage_into_pages_it_has():
    """A session rank's second result of a device tensor goes into the pages the first one made (a plain copy into
    existing memory), here with CPU storages standing in for CUDA ones."""
    import torch

    from notebook_accel.wire import results

    pool = results.ResultPool(limit=64 << 20)
    try:
        for round_ in range(2):
            source = torch.full((2 << 20,), round_ + 1, dtype=torch.uint8)
            pieces, fds, flags = pool.share([results._DeviceSource(source.untyped_storage())])
            mapped = results.map_shared(fds[0], 0, source.numel(), flags[0])
            os.close(fds[0])
            assert torch.equal(torch.frombuffer(mapped, dtype=torch.uint8), source)
            del mapped
            gc.collect()
        assert pool.reused == 1
    finally:
        pool.close()


STAND_IN_KERNEL = """
import sys
sys.path.insert(0, {here!r})
import cuda_stand_in
cuda_stand_in.install({folder!r})
import torch
from notebook_accel import notebook_launcher
from notebook_accel.plan.devices import fork_safety

def big():
    return {{"weights": torch.arange(4 << 20, dtype=torch.float32), "small": torch.ones(3)}}

value = notebook_launcher(big, num_processes=2, device="cpu", display="none")
print("VALUE", torch.equal(value["weights"], torch.arange(4 << 20, dtype=torch.float32)), value["small"].tolist())
print("CUDA", cuda_stand_in.init_calls(), torch.cuda.is_initialized(), fork_safety()[0])
"""


def test_a_kernel_with_a_cuda_driver_receives_a_result_without_initialising_it(tmp_path):
    """On a machine with a CUDA driver (the suite's stand-in): the result's tensors are CPU tensors over the shared
    memory, and the kernel's driver stays uninitialised (fork stays safe after it)."""
    import subprocess

    import cuda_stand_in
    from scripts import run_script

    try:
        cuda_stand_in.build(str(tmp_path))
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"no C compiler to build the stand-in driver: {error}")
    here = os.path.dirname(os.path.abspath(__file__))
    done = run_script(STAND_IN_KERNEL.format(here=here, folder=str(tmp_path)), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "VALUE True [1.0, 1.0, 1.0]" in done.stdout, done.stdout
    assert "CUDA 0 False True" in done.stdout, done.stdout


def test_pull_to_the_gpu_leaves_what_is_not_a_cuda_tensor_as_pull_does_and_refuses_other_devices():
    """``pull(name, device="cuda")`` hands CUDA tensors over by IPC (test_cuda_machine.py); what is not one comes
    back as with a plain ``pull`` (here, CPU ranks: all of it). An unknown device is refused before any run."""
    with Session(num_processes=2, device="cpu", display="none") as session:
        session.execute("import torch\nvalue = {'x': torch.arange(3 * 2 ** 18), 'n': [1, (2, 3)]}")
        pulled = session.pull("value", device="cuda")
        assert [item["n"] for item in pulled] == [[1, (2, 3)]] * 2
        assert all(torch.equal(item["x"], torch.arange(3 * 2 ** 18)) for item in pulled)
        with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu'"):
            session.pull("value", device="gpu")


class StandInCudaTensor(torch.Tensor):
    """A CPU tensor that says it is a CUDA one (``is_cuda``), and records each ``.cpu()`` of it: a rank's result
    takes the route ``send_result_event`` chooses for a CUDA tensor, on a machine without a GPU."""

    moved_to_host: list = []

    @property
    def is_cuda(self) -> bool:
        return True

    def cpu(self, *args, **kwargs):
        StandInCudaTensor.moved_to_host.append(self.untyped_storage().nbytes())
        return super().cpu(*args, **kwargs)


def test_a_large_cuda_result_is_not_moved_to_the_host_where_its_route_is_chosen(monkeypatch):
    """Issue 44: the device-route tests above build ``_DeviceSource`` by hand; this one goes through the choice
    itself (``rank.run.send_result_event`` on a real event channel): a CUDA tensor of at least ``SHARED_MIN_BYTES``
    is only detached (``goes_from_device``), to be copied from its GPU straight into shared memory — a ``.cpu()``
    there would make a second, pageable host copy of it; a small one is moved to the host, into the pickle."""
    import socket

    from notebook_accel.rank.run import send_result_event
    from notebook_accel.wire.channel import EventDecoder, EventSender, receive
    from notebook_accel.wire.payload import SHARED_MIN_BYTES

    monkeypatch.setattr(StandInCudaTensor, "moved_to_host", [])
    large = torch.arange(SHARED_MIN_BYTES // 4 * 2, dtype=torch.float32).as_subclass(StandInCudaTensor)
    small = torch.ones(3).as_subclass(StandInCudaTensor)
    rank_end, kernel_end = socket.socketpair()
    decoder = EventDecoder()
    try:
        send_result_event(EventSender(rank_end.fileno(), 0), {"large": large, "small": small})
        events = []
        while not events:
            events = decoder.feed(*receive(kernel_end.fileno(), 1 << 20))
        value = events[0].shared.load(events[0].payload)
    finally:
        decoder.close()
        rank_end.close()
        kernel_end.close()
    assert large.untyped_storage().nbytes() not in StandInCudaTensor.moved_to_host, \
        "a large CUDA result was moved to the host (.cpu()) where its route is chosen, not copied from the device"
    assert StandInCudaTensor.moved_to_host == [small.untyped_storage().nbytes()], \
        f"a small CUDA result was not moved to the host for the pickle ({StandInCudaTensor.moved_to_host})"
    assert torch.equal(value["large"], large) and torch.equal(value["small"], small)
