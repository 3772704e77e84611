"""Every bad input gets a clear error before any process starts."""
from __future__ import annotations

import socket
import os
import sys
import threading

import psutil
import pytest

from notebook_accel import notebook_launcher, start_launch
from notebook_accel.errors import LaunchConfigError, LaunchConfigTypeError
from notebook_accel.plan import devices

pytestmark = pytest.mark.timeout(60)

# What the launcher sees (a GPU hidden by CUDA_VISIBLE_DEVICES is not here): device='cuda' is valid then.
CUDA_HERE = devices.cuda_device_count() > 0


def ok():
    return "ok"


def no_children_started():
    return [child for child in psutil.Process().children(recursive=True)
            if "forkserver" not in " ".join(child.cmdline()) and "resource_tracker" not in " ".join(child.cmdline())]


@pytest.mark.parametrize("call, error, message", [
    (lambda: notebook_launcher("train"), LaunchConfigTypeError, "function must be callable"),
    (lambda: notebook_launcher(ok, args=[1]), LaunchConfigTypeError, r"args must be a tuple.*args=\(x,\)"),
    (lambda: notebook_launcher(ok, args=5), LaunchConfigTypeError, "args must be a tuple"),
    (lambda: notebook_launcher(ok, kwargs=[("a", 1)]), LaunchConfigTypeError, "kwargs must be a dict"),
    (lambda: notebook_launcher(ok, num_processes=0), LaunchConfigError, "positive int"),
    (lambda: notebook_launcher(ok, num_processes=-2), LaunchConfigError, "positive int"),
    (lambda: notebook_launcher(ok, num_processes=1.5), LaunchConfigError, "positive int"),
    (lambda: notebook_launcher(ok, num_processes=True), LaunchConfigError, "positive int"),
    (lambda: notebook_launcher(ok, num_processes=10_000, device="cpu"), LaunchConfigError,
     "more than the .* CPU ranks this"),
    (lambda: notebook_launcher(ok, device="tpu"), LaunchConfigError,
     "device='tpu' is not one of 'cuda', 'cpu', 'xla', 'mps'; did you mean 'xla'[?]$"),
    (lambda: notebook_launcher(ok, device="gpu"), LaunchConfigError, "device='gpu' .*; did you mean 'cuda'[?]$"),
    (lambda: notebook_launcher(ok, device="CPU"), LaunchConfigError, "device='CPU' .*; did you mean 'cpu'[?]$"),
    (lambda: notebook_launcher(ok, device="cuda:1"), LaunchConfigError, "; did you mean 'cuda'[?]$"),
    (lambda: notebook_launcher(ok, mixed_precision="fb16"), LaunchConfigError, "; did you mean 'fp16'[?]$"),
    (lambda: notebook_launcher(ok, display="nonsense"), LaunchConfigError, "'text', 'none'$"),  # nothing close
    pytest.param(lambda: notebook_launcher(ok, device="cuda"), LaunchConfigError,
                 r"device='cuda' .* none is available here: .*\. This machine has \d+ CPU cores?: pass "
                 r"device='cpu', or leave device out",
                 marks=pytest.mark.skipif(CUDA_HERE, reason="a GPU is here: device='cuda' is valid")),
    pytest.param(lambda: notebook_launcher(ok, device="mps"), LaunchConfigError, "device='mps' .* none is available",
                 marks=pytest.mark.skipif(sys.platform == "darwin", reason="macOS may have MPS")),
    (lambda: notebook_launcher(ok, mixed_precision="fp8"), LaunchConfigError,
     "mixed_precision='fp8' is not one of 'no', 'fp16', 'bf16'"),
    (lambda: notebook_launcher(ok, mixed_precision="fp16", device="cpu"), LaunchConfigError, "on CPU use 'bf16'"),
    (lambda: notebook_launcher(ok, start_method="thread"), LaunchConfigError,
     "start_method='thread' is not one of 'auto', 'fork', 'forkserver', 'spawn'"),
    (lambda: notebook_launcher(ok, display="html"), LaunchConfigError, "display='html' is not one of"),
    (lambda: notebook_launcher(ok, timeout=0), LaunchConfigError, "positive number of seconds"),
    (lambda: notebook_launcher(ok, timeout="10"), LaunchConfigError, "positive number of seconds"),
    (lambda: notebook_launcher(ok, use_port=70000), LaunchConfigError, "1..65535"),
    (lambda: notebook_launcher(ok, return_all="yes"), LaunchConfigTypeError, "return_all must be True or False"),
    (lambda: notebook_launcher(ok, master_addr=5), LaunchConfigTypeError, "master_addr must be a host name"),
    (lambda: notebook_launcher(ok, master_addr=""), LaunchConfigError, "master_addr must be a host name"),
    (lambda: notebook_launcher(ok, timout=5), LaunchConfigTypeError, "did you mean 'timeout'"),
])
def test_bad_input_is_refused_before_any_process_starts(call, error, message):
    with pytest.raises(error, match=message) as refused:
        call()
    assert str(refused.value).startswith("notebook_launcher: ")  # the call the user wrote
    assert no_children_started() == []


def test_xla_without_torch_xla_is_a_clear_error():
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed here")
    with pytest.raises(LaunchConfigError, match="device='xla' needs torch_xla, which is not installed"):
        notebook_launcher(ok, device="xla")


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_unpicklable_capture_is_named_where_ranks_need_a_pickle(start_method):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(LaunchConfigError, match="captured variable 'lock'.*or use start_method='fork'"):
        notebook_launcher(uses_lock, num_processes=2, display="none", start_method=start_method)
    with pytest.raises(LaunchConfigError, match=r"args\[1\]"):
        notebook_launcher(ok_with_args, args=(1, threading.Lock()), num_processes=2, display="none",
                          start_method=start_method)
    assert no_children_started() == []


def test_unpicklable_objects_are_fine_under_fork():
    """Forked ranks inherit the function and its arguments: nothing is pickled, so a lock is no problem."""
    lock = threading.Lock()

    def uses_lock(extra_lock):
        with lock, extra_lock:
            return int(os.environ["RANK"])

    assert notebook_launcher(uses_lock, args=(threading.Lock(),), num_processes=2, display="none",
                             start_method="fork", return_all=True) == [0, 1]


def ok_with_args(*args):
    return args


def test_fork_when_cuda_is_initialized_is_refused(monkeypatch):
    from notebook_accel.plan import devices as environment

    monkeypatch.setattr(environment, "cuda_initialized", lambda: True)
    with pytest.raises(LaunchConfigError, match="fork.*not safe here: CUDA is already initialized"):
        notebook_launcher(ok, num_processes=2, start_method="fork", display="none")
    # auto picks the forkserver instead, and works
    from notebook_accel.plan.plan import plan_launch

    assert plan_launch(ok, num_processes=2).start_method == "forkserver"


def test_busy_use_port_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchConfigError, match=f"use_port={port} cannot be used"):
            notebook_launcher(ok, num_processes=2, use_port=port, display="none")
    assert no_children_started() == []


def test_explicit_free_port_is_used():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    import os

    assert notebook_launcher(lambda: os.environ["MASTER_PORT"], num_processes=2, use_port=port,
                             display="none") == str(port)


def test_nested_launch_is_refused():
    def nested():
        return notebook_launcher(ok, num_processes=2, display="none")

    with pytest.raises(RuntimeError, match="launches cannot be nested"):
        notebook_launcher(nested, num_processes=2, display="none")


def test_a_refused_option_is_raised_without_the_planners_frames():
    # The user's input, not our bug: the message, with no plan_launch / _check_device frames above it.
    import traceback

    for launch in (lambda: notebook_launcher(ok, device="xla"), lambda: start_launch(ok, display="html")):
        with pytest.raises(LaunchConfigError) as refused:
            launch()
        ours = [frame.name for frame in traceback.extract_tb(refused.value.__traceback__)
                if "notebook_accel" in frame.filename]
        assert len(ours) == 1 and ours[0] in ("notebook_launcher", "start_launch"), ours
        assert refused.value.__cause__ is None and refused.value.__suppress_context__


SECRET = "hf_not_a_real_token_0f9e8d7c6b5a"  # a fake secret: what HF_TOKEN or a cloud key looks like to us


@pytest.mark.parametrize("call", [
    lambda: notebook_launcher(ok, device="tpu"),
    lambda: notebook_launcher(ok, mixed_precision="fp16", device="cpu"),
    lambda: notebook_launcher(ok, num_processes=2, num_nodes=2),
    lambda: notebook_launcher(ok, cluster="ray", master_addr="10.0.0.1"),
    lambda: notebook_launcher(ok, num_processes=2, device="cpu", start_method="spawn", args=(threading.Lock(),)),
])
def test_an_error_of_planning_never_shows_the_kernels_environment(monkeypatch, call):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(Exception) as refused:
        call()
    assert SECRET not in str(refused.value) and SECRET not in repr(refused.value)
    assert not no_children_started()


def test_a_plan_and_a_ranks_spec_never_show_the_kernels_environment(monkeypatch):
    """A plan is printed in tracebacks (IPython's verbose mode shows locals), logs and bug reports: the kernel's
    environment it carries for the ranks — the user's secrets with it — stays out of its repr."""
    from notebook_accel.plan.plan import plan_launch
    from notebook_accel.rank.process import RankSpec
    from notebook_accel.rank.xla.host import XlaHostSpec

    monkeypatch.setenv("HF_TOKEN", SECRET)
    plans = [plan_launch(ok, num_processes=1),  # in the kernel
             plan_launch(ok, num_processes=2, device="cpu", start_method="fork"),
             plan_launch(ok, num_processes=2, device="cpu", start_method="spawn"),
             plan_launch(ok, num_processes=1, device="cpu", num_nodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500"),
             plan_launch(ok, num_processes=2, cluster="ray")]  # planned only: nothing connects
    for plan in plans:
        assert plan.kernel_env["HF_TOKEN"] == SECRET  # the ranks still start from the kernel's environment
        assert SECRET not in repr(plan) and "HF_TOKEN" not in repr(plan)
    env = {"HF_TOKEN": SECRET}
    spec = RankSpec(rank=0, world_size=1, env=env, cwd="/", sys_path=[], payload=None, send_result=True,
                    stdout_fd=1, stderr_fd=2, events_fd=3, stacks_fd=4, lifeline_fd=5, env_changes=(env, []))
    host = XlaHostSpec(world_size=1, env=env, cwd="/", sys_path=[], payload=None, return_all=False, nprocs=1,
                       pipes=[], lifeline_fd=5)
    assert SECRET not in repr(spec) and SECRET not in repr(host)


@pytest.mark.parametrize("built, visible, said", [(False, None, "is built without CUDA"),
                                                  (True, "", "CUDA_VISIBLE_DEVICES='' hides every GPU"),
                                                  (True, None, "the CUDA driver sees no GPU")])
def test_why_there_is_no_cuda_here(monkeypatch, built, visible, said):
    import torch

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert said in devices.why_absent("cuda")


def test_a_refused_option_renders_in_ipython_from_the_users_line_only():
    # IPython always shows the last frame, hidden or not: the exception renders itself without ours (what a real
    # kernel shows is tests/test_kernel.py's; outside a shell, the hook formats as Python does, without our frames)
    with pytest.raises(LaunchConfigError) as refused:
        notebook_launcher(ok, device="gpu")
    shown = "\n".join(refused.value._render_traceback_())
    assert "notebook_accel" + os.sep not in shown, shown
    assert "test_launcher_errors.py" in shown and shown.rstrip().endswith("did you mean 'cuda'?")


def test_an_unbound_notebook_name_gets_a_note_saying_why():
    with pytest.raises(UnboundLocalError) as raised:
        notebook_launcher(assigns_a_global_it_reads, num_processes=2, display="none")
    notes = getattr(raised.value, "__notes__", [])
    assert any("`model` is assigned somewhere in `assigns_a_global_it_reads`, which makes it local" in note
               and "args=(model, ...)" in note for note in notes), notes
    with pytest.raises(UnboundLocalError) as plain_bug:  # a name no global has: Python's message says enough
        notebook_launcher(reads_a_local_before_setting_it, num_processes=2, display="none")
    assert not [note for note in getattr(plain_bug.value, "__notes__", []) if "is assigned somewhere" in note]


model = "the notebook's model"


def assigns_a_global_it_reads():
    model = model + ", prepared"  # noqa: F823 -- the pitfall itself
    return model


def reads_a_local_before_setting_it():
    if False:
        not_a_global = 1
    return not_a_global  # noqa: F821


def test_an_exception_without_a_message_ends_the_summary_without_a_bare_colon(capsys):
    import bdb

    def quits():  # what pdb's q raises in a rank
        raise bdb.BdbQuit()

    with pytest.raises(bdb.BdbQuit):
        notebook_launcher(quits, num_processes=2, display="text")
    out = capsys.readouterr().out
    assert "\nerror: BdbQuit\n" in out and "BdbQuit:" not in out, out
