"""A warm Session in a real Jupyter kernel (nbclient): %%ranks cells, state across cells, Jupyter's interrupt,
a rank's error raised in the cell, and no rank left once the kernel is gone."""
from __future__ import annotations

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from scripts import script_env
from test_kernel import assert_shown_from_the_users_call, cell_text
from waiting import wait_until

pytestmark = pytest.mark.timeout(240)

CELLS = [
    # 0: the set-up a user writes (the session's row: a widget, with a text summary for a saved notebook)
    """
import os, time
import torch
from notebook_accel import Session
%load_ext notebook_accel
threshold = 1               # a kernel name the forked ranks inherit: still the kernel's
session = Session(num_processes=2)
print("PIDS", *session.pids)
session                     # the row is shown above already: not a second time in this cell (issue 46)
""",
    # 1: a function from the notebook loads state on every rank
    """
def load(size):
    global model
    torch.manual_seed(0)
    model = torch.nn.Linear(size, 1)
    return "loaded"

print("RUN", session.run(load, args=(3,)))
""",
    # 2: a %%ranks cell sees it, sets a name, and its last value is printed per rank
    """%%ranks
import torch.distributed as dist
weight_sum = round(float(model.weight.sum()), 4)
print("rank", dist.get_rank(), "of", dist.get_world_size())
weight_sum * 0 + dist.get_rank()
""",
    # 3: %%ranks NAME, with a notebook class raised on one rank: the cell raises the rank's own exception
    """%%ranks session
class RankProblem(Exception):
    pass
if dist.get_rank() == 1:
    raise RankProblem("rank one is unhappy")
""",
    # 4: the kernel has a `model` too: the ranks' own is what runs use, and it stays theirs
    """
model = torch.nn.Linear(3, 1)
threshold = 2

def peek():
    return round(model.weight.sum().item(), 4)

print("OWN", session.run(peek, return_all=True) == [weight for weight in session.pull("weight_sum")],
      session.run(peek) != peek())
print("THRESHOLD", session.run(lambda: threshold))
del model
""",
    # 5: ... also for a %%ranks cell, once the kernel's is gone
    """%%ranks
round(model.weight.sum().item(), 4) == weight_sum
""",
    # 6: a run's error shows the cell's own lines
    """
def fails(step):
    loss = step * 2
    raise ValueError(f"loss {loss} at step {step}")

session.run(fails, args=(3,))
""",
    # 7: a long run, interrupted as by the Interrupt button (nbclient's interrupt_on_timeout)
    """
def sleepy():
    global interrupted
    interrupted = False
    print("sleeping", flush=True)
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        interrupted = True
        raise

session.run(sleepy)
""",
    # 8: the state survived all of it, on the same processes
    """
print("PULL", session.pull("interrupted"), session.pull("weight_sum") == [session.pull("weight_sum")[0]] * 2)
print("PIDS", *session.pids, "STATUS", session.status, "RESTARTS", session.restarts)
""",
    # 9: a session without a dashboard: a %%ranks cell still shows what it printed
    """
quiet = Session(num_processes=1, display="none")
""",
    """%%ranks quiet
print("quiet hello")
6 * 7
""",
    # 11: the session as a cell's value: its live row again, not a snapshot that a saved notebook shows stale
    """
session
""",
    # 12: closed: the saved notebook's text says so
    """
quiet.close()
session.close()
""",
]

INTERRUPT_AFTER = 15  # seconds, for the cell that sleeps on purpose (time.sleep(600)): Jupyter's interrupt then
CELL_BOUND = 120      # seconds, for every other cell: a bound that catches a hang (importing torch under load: 10+)


def interrupt_only_the_hanging_cell(cell) -> int:
    return INTERRUPT_AFTER if "time.sleep(600)" in cell.source else CELL_BOUND


def plain_text(cell) -> str:
    """What a saved notebook shows for the cell's displays where widgets do not render (GitHub, nbconvert)."""
    return "".join(output.get("data", {}).get("text/plain", "") for output in cell.outputs
                   if output.output_type in ("display_data", "execute_result"))


def errors_of(cell) -> list:
    return [output for output in cell.outputs if output.output_type == "error"]


def test_a_session_in_a_real_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source.strip()) for source in CELLS])
    client = NotebookClient(notebook, timeout_func=interrupt_only_the_hanging_cell, interrupt_on_timeout=True,
                            allow_errors=True, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells[:-1]):
            client.execute_cell(cell, index)
        outputs = [cell_text(cell) for cell in notebook.cells]
        pids = [int(pid) for pid in outputs[0].split("PIDS")[1].split()[:2]]
        assert all(psutil.pid_exists(pid) for pid in pids)
        row_while_open = plain_text(notebook.cells[0])
        client.execute_cell(notebook.cells[-1], len(notebook.cells) - 1)
        kernel_pid = client.km.provisioner.process.pid
    # The kernel is gone (shut down as a notebook closes): so are its ranks.
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 20, "the closed kernel's ranks to end")
    assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == psutil.STATUS_ZOMBIE

    assert "RUN loaded" in outputs[1], outputs[1]
    assert "[rank 0] rank 0 of 2" in outputs[2] and "[rank 1] rank 1 of 2" in outputs[2], outputs[2]
    assert "[rank 0] 0.0" in outputs[2] and "[rank 1] 1.0" in outputs[2], outputs[2]

    error = [output for output in notebook.cells[3].outputs if output.output_type == "error"]
    assert error and error[0].ename == "RankProblem" and error[0].evalue == "rank one is unhappy", outputs[3]
    assert 'raise RankProblem("rank one is unhappy")' in outputs[3]  # the cell's own line, in the rank's traceback
    assert_shown_from_the_users_call(error[0], "run_cell_magic")  # then the cell, its message: none of our frames

    assert "OWN True True" in outputs[4] and "THRESHOLD 2" in outputs[4], outputs[4]
    notes = [line for line in outputs[4].splitlines() if "`model`" in line]
    assert len(notes) == 1 and "kernel" in notes[0], outputs[4]  # one line, said once
    assert "[rank 0] True" in outputs[5] and "[rank 1] True" in outputs[5], outputs[5]

    assert 'raise ValueError(f"loss {loss} at step {step}")' in outputs[6], outputs[6]
    assert "<dynamic-code>" not in outputs[6], outputs[6]
    assert_shown_from_the_users_call(errors_of(notebook.cells[6])[0], "session.run(fails, args=(3,))")

    assert "[rank 0] sleeping" in outputs[7] and "ERROR KeyboardInterrupt" in outputs[7], outputs[7]
    assert "selectors.py" not in outputs[7], outputs[7]  # the traceback ends at the session call
    assert_shown_from_the_users_call(errors_of(notebook.cells[7])[0], "session.run(sleepy)")
    dashboard = plain_text(notebook.cells[7])
    assert "stopped" in dashboard and "failed" not in dashboard, dashboard
    assert "PULL [True, True] True" in outputs[8], outputs[8]
    assert f"PIDS {pids[0]} {pids[1]} STATUS idle RESTARTS 0" in outputs[8], outputs[8]

    assert "[rank 0] quiet hello" in outputs[10] and "[rank 0] 42" in outputs[10], outputs[10]

    assert [output.output_type for output in notebook.cells[0].outputs].count("display_data") == 1, \
        notebook.cells[0].outputs  # the row once, though the cell ends with `session`
    assert row_while_open.startswith("notebook_accel session: 2 ranks"), row_while_open
    assert "HTML(" not in row_while_open and "idle" in row_while_open, row_while_open
    row = plain_text(notebook.cells[0])
    assert "closed" in row and "HTML(" not in row, row
    shown_again = notebook.cells[11]
    assert [output.output_type for output in shown_again.outputs] == ["display_data"], shown_again.outputs
    assert plain_text(shown_again) == row  # followed the row to "closed", as the first one did


def test_a_killed_kernel_ends_its_session_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from notebook_accel import Session\nsession = Session(num_processes=2, display='none')\n"
        "print('PIDS', *session.pids)")])
    client = NotebookClient(notebook, timeout=60, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        client.execute_cell(notebook.cells[0], 0)
        pids = [int(pid) for pid in cell_text(notebook.cells[0]).split("PIDS")[1].split()]
        kernel = psutil.Process(client.km.provisioner.process.pid)
        kernel.kill()  # SIGKILL: no atexit, no finalizer runs
        kernel.wait(10)
        wait_until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 20, "a SIGKILLed kernel's ranks to end")
