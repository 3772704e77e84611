"""notebook_launcher in a real Jupyter kernel (nbclient): cell outputs, errors, interrupt, no leftovers."""
from __future__ import annotations

import re

import nbformat
import pytest
from nbclient import NotebookClient

from scripts import script_env

pytestmark = pytest.mark.timeout(240)

CELLS = [
    # 0: set-up, as a user would write it
    """
import os, time
import torch
from notebook_accel import notebook_launcher
""",
    # 1: a function defined in the notebook (__main__), capturing notebook data, with gloo
    """
weights = torch.arange(4.0)

def train(scale):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    total = weights.sum() * scale
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} total {total.item()}")
    return dist.get_rank(), total.item()

result = notebook_launcher(train, args=(2,), num_processes=2, display="text", return_all=True)
print("RESULT", result)
""",
    # 2: an exception class defined in the notebook, raised on one rank while the other waits
    """
class NotebookError(Exception):
    pass

def fails():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise NotebookError("rank one gave up")
    dist.barrier()

notebook_launcher(fails, num_processes=2, display="text")
""",
    # 3: a hung launch, interrupted by nbclient (interrupt_on_timeout) like the Interrupt button
    """
def hangs():
    print("hanging", flush=True)
    time.sleep(600)

notebook_launcher(hangs, num_processes=2, display="text")
""",
    # 4: the kernel is still usable: launch again, and nothing of the earlier launches is left
    """
import psutil
again = notebook_launcher(lambda: os.environ["WORLD_SIZE"], num_processes=2, display="text")
left = [p.pid for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE
        and "forkserver" not in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline())]
print("AGAIN", again, "LEFT", left)
""",
    # 5: the notebook's own classes come back as themselves (fork, the default here): except and isinstance
    """
from dataclasses import dataclass

@dataclass
class Result:
    rank: int

try:
    notebook_launcher(fails, num_processes=2, display="none")
except NotebookError as caught:
    print("CAUGHT", type(caught) is NotebookError)
results = notebook_launcher(lambda: Result(int(os.environ["RANK"])), num_processes=2, display="none",
                            return_all=True)
print("ISINSTANCE", [isinstance(result, Result) for result in results])
""",
    # 6: a misspelled option: refused before anything starts, said from the user's line
    """
notebook_launcher(fails, num_processs=2)
""",
]

INTERRUPT_AFTER = 20  # seconds, for the cell that hangs on purpose (time.sleep(600)): Jupyter's interrupt then
CELL_BOUND = 120      # seconds, for every other cell: a bound that catches a hang (importing torch under load: 10+)


def interrupt_only_the_hanging_cell(cell) -> int:
    return INTERRUPT_AFTER if "time.sleep(600)" in cell.source else CELL_BOUND


def cell_text(cell) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append(f"ERROR {output.ename}: {output.evalue}\n" + "\n".join(output.traceback))
    return "".join(parts)


def test_launches_in_a_real_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source.strip()) for source in CELLS])
    client = NotebookClient(notebook, timeout_func=interrupt_only_the_hanging_cell, interrupt_on_timeout=True,
                            allow_errors=True, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [cell_text(cell) for cell in notebook.cells]

    assert "[rank 0] rank 0 total 24.0" in outputs[1] and "[rank 1] rank 1 total 24.0" in outputs[1]
    assert "RESULT [(0, 24.0), (1, 24.0)]" in outputs[1]

    error = [output for output in notebook.cells[2].outputs if output.output_type == "error"]
    assert error and error[0].ename == "NotebookError" and error[0].evalue == "rank one gave up"
    assert "raise NotebookError" in outputs[2]  # the rank's own traceback is shown in the cell
    # ... then the user's line and the message: none of the launcher's frames (IPython shows a hidden frame when it
    # is the last one: the exception renders itself without them, ``outcome.shown``)
    assert_shown_from_the_users_call(error[0], "notebook_launcher(fails, num_processes=2")

    assert "[rank 0] hanging" in outputs[3]
    interrupt = [output for output in notebook.cells[3].outputs if output.output_type == "error"]
    assert interrupt and interrupt[0].ename == "KeyboardInterrupt", outputs[3]
    assert interrupt[0].evalue == "the launch was interrupted; every rank was stopped", outputs[3]
    assert_shown_from_the_users_call(interrupt[0], "notebook_launcher(hangs, num_processes=2")

    assert "AGAIN 2 LEFT []" in outputs[4], outputs[4]
    assert "CAUGHT True" in outputs[5] and "ISINSTANCE [True, True]" in outputs[5], outputs[5]

    typo = [output for output in notebook.cells[6].outputs if output.output_type == "error"]
    assert typo and typo[0].ename == "LaunchConfigTypeError", outputs[6]
    assert typo[0].evalue.endswith("unexpected keyword argument 'num_processs'; did you mean 'num_processes'?")
    assert_shown_from_the_users_call(typo[0], "notebook_launcher(fails, num_processs=2)")


def assert_shown_from_the_users_call(error, call: str) -> None:
    """The cell's error shows the user's line, then the message: no frame, no source line of notebook_accel."""
    shown = [ANSI.sub("", entry) for entry in error.traceback]
    ours = [entry for entry in shown if re.search(r"notebook_accel[/\\]\w", entry)]
    assert ours == [], shown
    at_call = max(index for index, entry in enumerate(shown) if call in entry)
    after = shown[at_call + 1:]  # the message (and its notes), no frame
    assert after and after[0].startswith(f"{error.ename}: {error.evalue}".splitlines()[0]), shown
    assert not [entry for entry in after if "File " in entry or "---->" in entry], shown


ANSI = re.compile(r"\x1b\[[0-9;]*m")
