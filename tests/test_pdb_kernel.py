"""pdb in a rank, from a real Jupyter kernel: the cell opens an input box labelled with the rank, and what is
typed there reaches the rank's pdb (issue 27).

The kernel is driven as a front end drives it (``jupyter_client``: ``execute(..., allow_stdin=True)``, each
``input_request`` answered); the ranks are real processes forked from the kernel, with real gloo.
"""
from __future__ import annotations

import re
import textwrap

import pytest

from scripts import script_env
from typing_kernel import Answers, SharedKernel, plain

pytestmark = pytest.mark.timeout(300)

IMPORTS = "import os\nfrom notebook_accel import Session, notebook_launcher\n"


@pytest.fixture(scope="module")
def shared_kernel(tmp_path_factory):
    shared = SharedKernel(cwd=str(tmp_path_factory.mktemp("kernel")), setup=IMPORTS)
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def kernel(shared_kernel, request):
    """The module's kernel, as a fresh one would be for this test (see ``SharedKernel``)."""
    failed_before = request.session.testsfailed
    kernel = shared_kernel.reset()
    yield kernel
    left = shared_kernel.ranks_left()
    if left or request.session.testsfailed != failed_before:  # what it left is unknown: not for the next test
        shared_kernel.close()
    assert not left, f"processes the test left running in the kernel: {left}"


def cell(code: str) -> str:
    return textwrap.dedent(code).strip()


def test_breakpoint_in_one_rank_asks_in_the_cell_and_what_is_typed_reaches_the_rank(kernel):
    answers = Answers([
        (r"^\[rank 1\] \(Pdb\) $", "p x"),
        (r"^\[rank 1\] \(Pdb\) $", "w"),
        (r"^\[rank 1\] \(Pdb\) $", "l"),
        (r"^\[rank 1\] \(Pdb\) $", "x = 100"),       # the rank's own variable, changed from the cell
        (r"^\[rank 1\] \(Pdb\) $", "c"),
    ])
    run = kernel.run(cell("""
        def train():
            rank = int(os.environ["RANK"])
            x = 40 + rank
            if rank == 1:
                breakpoint()
            return x
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text",
                                          return_all=True))
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    assert "41" in run.output_after(0), run.output_after(0)             # p x, printed by rank 1's pdb
    stack = run.output_after(1)                                          # w: the rank's stack, the user's frames
    assert "train()" in stack and not re.search(r"/multiprocessing/|/IPython/|/ipykernel/|/asyncio/|rank/run\.py",
                                                stack), stack
    assert "breakpoint()" in run.output_after(2)                         # l: the source around the line
    assert "RESULT [40, 100]" in run.output, plain(run.output)         # the assignment reached the rank
    before = run.prompts[0].output_before  # pdb's own "where" line (the line after breakpoint()), labelled
    assert re.search(r"\[rank 1\] > .*\(6\)train\(\)\n\[rank 1\] -> return x", before), before


def test_two_ranks_at_a_breakpoint_get_their_turns_one_at_a_time(kernel):
    answers = Answers([
        (r"^\[rank \d\] \(Pdb\) $", "p ('I am', rank)"),
        (r"^\[rank \d\] \(Pdb\) $", "n"),                 # a step stays with the same rank ...
        (r"^\[rank \d\] \(Pdb\) $", "p ('I am', rank)"),
        (r"^\[rank \d\] \(Pdb\) $", "c"),                 # ... c hands the prompt to the other one
        (r"^\[rank \d\] \(Pdb\) $", "p ('I am', rank)"),
        (r"^\[rank \d\] \(Pdb\) $", "c"),
    ])
    run = kernel.run(cell("""
        def train():
            rank = int(os.environ["RANK"])
            breakpoint()
            after = rank * 10
            return after
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text",
                                          return_all=True))
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    labels = [int(re.match(r"\[rank (\d)\]", prompt.text).group(1)) for prompt in run.prompts]
    first, second = labels[0], 1 - labels[0]
    assert labels == [first] * 4 + [second] * 2, labels
    for index, rank in ((0, first), (2, first), (4, second)):  # each "p" answered by the rank the prompt named
        assert f"('I am', {rank})" in run.output_after(index), run.output_after(index)
    assert "RESULT [0, 10]" in run.output


def test_dist_breakpoint_on_rank_0_while_rank_1_waits_and_nothing_times_out(kernel):
    # rank 0 sits at its prompt longer than the launch's timeout and the early-leaver notice's wait: neither fires
    answers = Answers([
        (r"^\[rank 0\] \(Pdb\) $", "up", 6.0),
        (r"^\[rank 0\] \(Pdb\) $", "p marker"),
        (r"^\[rank 0\] \(Pdb\) $", "c"),
    ])
    run = kernel.run(cell("""
        os.environ["NOTEBOOK_ACCEL_PEER_WAIT"] = "1"
        def train():
            import torch.distributed as dist
            dist.init_process_group("gloo")
            marker = f"caller frame of rank {dist.get_rank()}"
            dist.breakpoint(rank=0)
            dist.barrier()
            rank = dist.get_rank()
            dist.destroy_process_group()
            return rank
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text",
                                          return_all=True, timeout=4))
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    assert "'caller frame of rank 0'" in run.output_after(1), run.output_after(1)
    assert "RESULT [0, 1]" in run.output
    assert "perhaps waiting for it" not in run.output


def test_pdb_on_opens_post_mortem_in_the_failing_ranks_frame_then_raises_its_exception(kernel):
    kernel.run("%pdb on")
    answers = Answers([
        (r"^\[rank 1\] \(Pdb\) $", "p local_marker"),
        (r"^\[rank 1\] \(Pdb\) $", "q"),
    ])
    run = kernel.run(cell("""
        def train():
            rank = int(os.environ["RANK"])
            local_marker = f"frame of rank {rank}"
            if rank == 1:
                raise ValueError("rank 1 breaks")
            return rank
        notebook_launcher(train, num_processes=2, start_method="fork", display="text")
    """), answers)
    answers.check(run)  # and no second debugger in the kernel's own frame after q
    assert "'frame of rank 1'" in run.output_after(0), run.output_after(0)
    assert run.error is not None and run.error["ename"] == "ValueError", plain(run.output)
    assert "rank 1 breaks" in run.error["evalue"]


def test_after_q_in_the_root_cause_a_peer_that_failed_in_barrier_opens_no_second_post_mortem(kernel):
    # Issue 36: rank 0 waits in torch's barrier for rank 1; once rank 1's pdb ends, rank 0 fails ("Connection
    # closed by peer"). Only the root cause is debugged: rank 0 is stopped, no second pdb opens inside barrier().
    kernel.run("%pdb on")
    answers = Answers([(r"^\[rank 1\] \(Pdb\) $", "q")], fallback="q")
    run = kernel.run(cell("""
        def train():
            import torch.distributed as dist
            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                raise ValueError("rank 1 breaks")
            dist.barrier()
        notebook_launcher(train, num_processes=2, start_method="fork", display="text")
    """), answers)
    answers.check(run)
    assert "[rank 0] post-mortem" not in plain(run.output), plain(run.output)
    assert run.error is not None and run.error["ename"] == "ValueError", plain(run.output)


def test_session_debug_after_a_failure_then_the_session_runs_again(kernel):
    answers = Answers([
        (r"^\[rank 1\] \(Pdb\) $", "p secret"),
        (r"^\[rank 1\] \(Pdb\) $", "q"),
    ])
    run = kernel.run(cell("""
        session = Session(num_processes=2, start_method="fork", display="text")
        def fails():
            secret = 1234 + int(os.environ["RANK"])
            if os.environ["RANK"] == "1":
                raise KeyError("missing")
            return secret
        try:
            session.run(fails)
        except KeyError:
            print("FAILED AS EXPECTED")
        session.debug()
        print("AFTER", session.run(lambda: 7, return_all=True), "RUNS", session.runs)
        session.close()
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    assert "FAILED AS EXPECTED" in run.output
    assert "1235" in run.output_after(0), run.output_after(0)
    assert "AFTER [7, 7] RUNS 2" in run.output  # the failed run and the last one: debug() is no run


def test_the_in_kernel_rank_asks_too(kernel):
    # the person takes longer than the launch's timeout: its clock stands still while the rank is at the prompt
    answers = Answers([(r"^\[rank 0\] \(Pdb\) $", "p x", 5.0), (r"^\[rank 0\] \(Pdb\) $", "c")])
    run = kernel.run(cell("""
        def train():
            x = "inline value"
            breakpoint()
            return x
        print("RESULT", notebook_launcher(train, num_processes=1, display="text", timeout=3))
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    assert "'inline value'" in run.output_after(0)
    assert "RESULT inline value" in run.output


def test_a_cell_without_stdin_skips_the_breakpoint_with_a_notice(kernel):
    run = kernel.run(cell("""
        def train():
            x = 5
            breakpoint()
            return x
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text"))
    """), allow_stdin=False, timeout=120)
    assert run.error is None, plain(run.output)
    assert not run.prompts
    assert "RESULT 5" in run.output
    assert re.search(r"\[rank [01]\] notebook_accel: rank [01]'s breakpoint at .*:3 was skipped", run.output), \
        run.output


def test_a_headless_notebook_with_a_forgotten_breakpoint_runs_through_with_a_notice(tmp_path, monkeypatch):
    """nbclient (as papermill and nbval run notebooks) sends no input boxes: every breakpoint, on process ranks and
    on the in-kernel rank, is skipped with one line naming the rank and the place; ``PYTHONBREAKPOINT=0`` silences
    them. Nothing waits for a person who is not there."""
    import time

    import nbformat
    from nbclient import NotebookClient

    cells = [IMPORTS + "import pdb", cell("""
        def train():
            rank = int(os.environ["RANK"])
            if rank == 1:
                breakpoint()
            else:
                pdb.set_trace()
            return rank * 10
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text",
                                          return_all=True))
    """), cell("""
        def inline():
            breakpoint()
            return "inline done"
        print("RESULT", notebook_launcher(inline, num_processes=1, display="text"))
    """), cell("""
        os.environ["PYTHONBREAKPOINT"] = "0"   # as in Python: breakpoint() is off (pdb.set_trace() is not)
        def only_breakpoints():
            breakpoint()
            return int(os.environ["RANK"]) * 10
        print("RESULT", notebook_launcher(only_breakpoints, num_processes=2, start_method="fork", display="text",
                                          return_all=True))
    """)]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    started = time.monotonic()
    client.execute()
    seconds = time.monotonic() - started

    def shown(index: int) -> str:
        return "".join(output.get("text", "") for output in notebook.cells[index].outputs)

    two_ranks, inline, silenced = shown(1), shown(2), shown(3)
    assert "RESULT [0, 10]" in two_ranks, two_ranks
    assert re.search(r"\[rank 1\] notebook_accel: rank 1's breakpoint at .*:4 was skipped: this notebook runs "
                     r"without input boxes", two_ranks), two_ranks
    # pdb.set_trace() is pdb itself (no hook to ask first): it says where it stands (the line after the call) before
    # its first command finds no one to type; PYTHONBREAKPOINT does not apply to it, and the line does not say so
    skipped = re.search(r"\[rank 0\] notebook_accel: rank 0's pdb at .*:7 was skipped: [^\n]*", two_ranks)
    assert skipped and "PYTHONBREAKPOINT" not in skipped.group(0), two_ranks
    assert "RESULT inline done" in inline and re.search(r"rank 0's breakpoint at .*:2 was skipped", inline), inline
    assert "RESULT [0, 10]" in silenced and "skipped" not in silenced and "Pdb" not in silenced, silenced
    assert seconds < 240, seconds  # a cell's timeout (120 s) catches a hang; this only says "no one was waited for"


def test_interact_opens_a_console_in_the_ranks_frame_and_exit_returns_to_pdb(kernel):
    # A notebook's input box cannot send Ctrl-D: exit() leaves the console back to pdb (as in Python 3.13's pdb),
    # instead of ending the rank
    answers = Answers([
        (r"^\[rank 1\] \(Pdb\) $", "interact"),
        (r"^\[rank 1\] >>> $", "y = x * 2"),          # Python's console prompt, not the kernel's "In : "
        (r"^\[rank 1\] >>> $", "print('Y IS', y)"),
        (r"^\[rank 1\] >>> $", "exit()"),
        (r"^\[rank 1\] \(Pdb\) $", "p x"),
        (r"^\[rank 1\] \(Pdb\) $", "c"),
    ])
    run = kernel.run(cell("""
        def train():
            rank = int(os.environ["RANK"])
            x = 40 + rank
            if rank == 1:
                breakpoint()
            return x
        print("RESULT", notebook_launcher(train, num_processes=2, start_method="fork", display="text",
                                          return_all=True))
    """), answers)
    answers.check(run)
    assert run.error is None, plain(run.output)
    assert "Y IS 82" in run.output_after(2), run.output_after(2)
    assert "41" in run.output_after(4), run.output_after(4)
    assert "RESULT [40, 41]" in run.output, plain(run.output)
