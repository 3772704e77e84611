"""The outcome's rules, written once and shared by every backend and node: the root cause, how a death is
worded, and the exception the kernel raises for it."""
from __future__ import annotations

import pickle

import pytest

from notebook_accel.backends.nodes.attempt import NodeFailure
from notebook_accel.backends.nodes.backend import root_exception
from notebook_accel.errors import LaunchError, one_line
from notebook_accel.outcome.death import TAIL_LINES, describe_death
from notebook_accel.outcome.raising import root_cause_exception
from notebook_accel.outcome.root_cause import Failure, choose_root_cause
from notebook_accel.wire.events import RankFailed, Status


def failed(rank: int, exc: BaseException, at: float = 0.0) -> RankFailed:
    return RankFailed(rank=rank, exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}", message=str(exc),
                      traceback=f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}\n",
                      exception=pickle.dumps(exc), time=at)


@pytest.mark.parametrize("exitcode, words", [
    (-9, "was killed by SIGKILL"),
    (-11, "was killed by SIGSEGV"),
    (3, "exited with code 3"),
    (0, "exited with code 0 without returning a result (os._exit?)"),
])
def test_a_death_is_worded_once(exitcode, words):
    assert describe_death(exitcode) == words
    on_one_node = root_cause_exception(Failure(1, 0.0, exitcode=exitcode), world_size=2)
    on_two_nodes = root_exception(NodeFailure(1, node=1, host="host-b", attempt=0, rank=3, exitcode=exitcode),
                                  world_size=4, history=[])
    assert str(on_one_node) == f"rank 1 {words}"
    assert str(on_two_nodes) == f"rank 3 on node 1 (host-b) {words}"
    assert (on_one_node.exitcode, on_two_nodes.exitcode) == (exitcode, exitcode)


def test_a_death_quotes_the_last_output_lines():
    lines = [f"step {index}" for index in range(40)]
    error = root_cause_exception(Failure(0, 0.0, exitcode=-9), world_size=1, last_output=lines)
    quoted = str(error).split("its last output:\n", 1)[1].splitlines()
    assert [line.strip() for line in quoted] == lines[-TAIL_LINES:]


def test_a_deaths_one_line_ends_with_its_last_output_not_a_colon():
    # issue 46: the text summary ended "error: LaunchError: rank 1 was killed by SIGKILL; its last output:"
    error = root_cause_exception(Failure(1, 0.0, exitcode=-9), world_size=2, last_output=["step 6", "step 7"])
    assert one_line(error) == "LaunchError: rank 1 was killed by SIGKILL; its last output: … step 7"
    single = root_cause_exception(Failure(1, 0.0, exitcode=-9), world_size=2, last_output=["step 7"])
    assert one_line(single) == "LaunchError: rank 1 was killed by SIGKILL; its last output: step 7"
    silent = root_cause_exception(Failure(1, 0.0, exitcode=-9), world_size=2, last_output=[])
    assert one_line(silent) == "LaunchError: rank 1 was killed by SIGKILL"


def test_sys_exit_is_a_launch_error_with_its_code_on_one_node_and_on_several():
    event = failed(1, SystemExit(7))
    one = root_cause_exception(Failure(1, 0.0, event=event), world_size=2, exitcode=7)
    several = root_exception(NodeFailure(2, node=1, host="host-b", attempt=0, rank=1, event=event),
                             world_size=4, history=[])
    assert isinstance(one, LaunchError) and isinstance(several, LaunchError)
    assert (one.exitcode, several.exitcode) == (7, 7)  # the node's copy knows it only from the message
    assert "called sys.exit(7)" in str(one) and "on node 1 (host-b) called sys.exit(7)" in str(several)


def test_the_same_root_cause_for_processes_and_nodes():
    # rank 0 reacts to rank 1's death ("Connection closed by peer") and is seen first: rank 1 is the cause.
    reaction = failed(0, RuntimeError("[gloo] Connection closed by peer"), at=1.0)
    cause = failed(1, ValueError("bad batch"), at=2.0)
    local = choose_root_cause([Failure(0, 1.0, event=reaction), Failure(1, 2.0, event=cause)])
    nodes = choose_root_cause([NodeFailure(1, 0, "a", 0, 0, event=reaction),
                               NodeFailure(2, 1, "b", 0, 1, event=cause)], order=lambda failure: failure.seq)
    assert (local.rank, nodes.rank) == (1, 1)
    # all collateral: the earliest by each side's own order
    both = [NodeFailure(5, 0, "a", 0, 0, event=reaction), NodeFailure(4, 1, "b", 0, 2, event=reaction)]
    assert choose_root_cause(both, order=lambda failure: failure.seq).rank == 2


def test_a_rebuilt_exception_keeps_its_type_and_names_its_node():
    error = root_exception(NodeFailure(3, node=1, host="host-b", attempt=1, rank=2, event=failed(2, KeyError("k"))),
                           world_size=4, history=[NodeFailure(1, 0, "host-a", 0, 0, exitcode=-9)])
    assert isinstance(error, KeyError) and (error.node, error.host, error.rank) == (1, "host-b", 2)
    assert error.__notes__[-2:] == ["(notebook_accel: rank 2 ran on node 1 (host-b), attempt 2)",
                                    "(notebook_accel: attempt 1 failed first: rank 0 on node 0 (host-a): "
                                    "was killed by SIGKILL)"]


def test_statuses_are_strings_that_read_as_their_value():
    assert Status.FAILED == "failed" and f"{Status.TIMEOUT}" == "timeout" and str(Status.STOPPED) == "stopped"
    assert pickle.loads(pickle.dumps(Status.FINISHED)) is Status.FINISHED


def raised_by(action) -> BaseException:
    try:
        action()
    except BaseException as exc:  # noqa: B902 - whatever torch or Python raise is what the rank would send
        return exc
    raise AssertionError("expected an exception")


def test_out_of_memory_is_recognised_from_what_torch_and_python_raise():
    import torch

    from notebook_accel.outcome.oom import kind_of_failure

    # Raised here for real: torch's CPU allocator failing (a plain RuntimeError in torch 2.13), Python's
    # MemoryError; an unrelated RuntimeError is no memory story.
    cpu = raised_by(lambda: torch.empty(2 ** 62, dtype=torch.uint8))
    assert type(cpu) is RuntimeError
    assert kind_of_failure(failed(1, cpu), None, None) == "host-allocator"
    assert kind_of_failure(failed(1, raised_by(lambda: bytearray(2 ** 62))), None, None) == "host"
    assert kind_of_failure(failed(1, raised_by(lambda: torch.ones(2) @ torch.ones(3))), None, None) is None
    # No GPU here, so torch's CUDA error is built by hand: its type (what the classifier keys on) and the
    # caching allocator's message; test_debugging raises the real one where CUDA is available.
    gpu = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
                                 "of 79.10 GiB of which 1.06 GiB is free.")
    assert kind_of_failure(failed(1, gpu), None, None) == "gpu"


# Messages torch's CUDA caching allocator wrote (c10/cuda/CUDACachingAllocator.cpp's format, figures from real
# failures): torch >= 2.1, with another process on the card; the in-kernel case (400 GiB asked on an H200,
# 512 bytes allocated by PyTorch); and torch < 2.1's older layout.
TORCH_2_OOM = ("CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of which "
               "1.58 GiB is free. Process 2493055 has 12.02 GiB memory in use. Including non-PyTorch memory, this "
               "process has 966.00 MiB memory in use. Of the allocated memory 734.07 MiB is allocated by PyTorch, "
               "and 33.93 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
               "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
               "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-"
               "variables)")
IN_KERNEL_OOM = ("CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total capacity of 139.80 GiB of "
                 "which 138.93 GiB is free. Including non-PyTorch memory, this process has 834.00 MiB memory in use. "
                 "Of the allocated memory 512 bytes is allocated by PyTorch, and 1.99 MiB is reserved by PyTorch but "
                 "unallocated.")
TORCH_1_OOM = ("CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
               "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If reserved memory is >> "
               "allocated memory try setting max_split_size_mb to avoid fragmentation.")


def test_a_cuda_out_of_memory_message_gives_its_figures_in_bytes():
    from notebook_accel.outcome.oom import cuda_oom_figures

    GiB, MiB = 2 ** 30, 2 ** 20
    figures = cuda_oom_figures(TORCH_2_OOM)
    assert figures.asked == round(1.95 * GiB) and figures.gpu == 0
    assert (figures.total, figures.free) == (round(14.57 * GiB), round(1.58 * GiB))
    assert figures.process_in_use == 966 * MiB  # this process, not "Process 2493055" before it
    assert figures.allocated_by_torch == round(734.07 * MiB)
    kernel = cuda_oom_figures(IN_KERNEL_OOM)
    assert (kernel.asked, kernel.allocated_by_torch, kernel.process_in_use) == (400 * GiB, 512, 834 * MiB)
    old = cuda_oom_figures(TORCH_1_OOM)
    assert (old.asked, old.gpu, old.total, old.free) == (36 * MiB, 0, round(7.93 * GiB), round(47.06 * MiB))
    assert (old.allocated_by_torch, old.reserved_by_torch, old.process_in_use) == (
        round(130.35 * MiB), 188 * MiB, None)
    assert cuda_oom_figures("CUDA out of memory.").text() == ""


def test_a_gpu_out_of_memory_line_says_what_was_asked_the_cards_total_and_free_and_a_real_peak():
    from notebook_accel.outcome.oom import cuda_oom_figures, explain

    # In the kernel the launch ended before any NVML sample: torch's counter says 512 B; what the process held
    # when the allocation failed (torch's message) is the peak shown instead.
    line = explain("gpu", 0, {0: (2 ** 30, 512)}, cuda_oom_figures(IN_KERNEL_OOM))
    assert line.startswith("rank 0 ran out of GPU memory (CUDA out of memory): asked for 400 GiB on GPU 0 "
                           "(140 GiB in all, 139 GiB free; this process held 834 MiB, 512 B of it allocated by "
                           "PyTorch); peak GPU memory per rank: rank 0: 834 MiB; try a smaller batch size"), line
    # a peak sampled higher than the message's figure stays; the other ranks' peaks are theirs
    line = explain("gpu", 1, {0: (0, 5 * 2 ** 30), 1: (0, 9 * 2 ** 30)}, cuda_oom_figures(TORCH_2_OOM))
    assert "asked for 2.0 GiB on GPU 0 (14.6 GiB in all, 1.6 GiB free;" in line
    assert "peak GPU memory per rank: rank 0: 5.0 GiB, rank 1: 9.0 GiB;" in line
    assert "\n" not in line
    assert explain("gpu", 0, {}, None) == explain("gpu", 0, {}, cuda_oom_figures("CUDA out of memory."))


@pytest.mark.parametrize("message, debugged", [
    ("bad batch", True),
    ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1454. GLHF!", False),
])
def test_post_mortem_opens_on_a_ranks_own_failure_never_on_its_reaction_to_a_peers(monkeypatch, message, debugged):
    # Issue 36: with pdb on, a rank that failed in barrier() because the root cause's pdb ended opened a second
    # post-mortem. Decided in the rank (rank.run), by the same rule that keeps such a failure from being the root
    # cause; the end-to-end check is in test_pdb_terminal/test_pdb_kernel, where the stop may beat the banner.
    import os

    import notebook_accel.rank.run as run
    from notebook_accel.wire.channel import EventSender

    opened = []
    monkeypatch.setattr(run, "open_post_mortem", opened.append)

    def train():
        raise RuntimeError(message)

    read, write = os.pipe()
    try:
        result = run.run_rank(lambda: (train, (), {}), EventSender(write, 0), send_result=False, thread_only=True,
                              post_mortem=True)
    finally:
        os.close(read)
        os.close(write)
    assert result.exit_code == 1 and result.failure.message == message
    assert [str(exc) for exc in opened] == ([message] if debugged else [])
