"""Stack dumps of ranks forked from a real Jupyter kernel show the user's frames, not the kernel's.

A forked rank's main thread carries the kernel's whole stack from the moment of the fork under its own
(IPython, ipykernel, asyncio, tornado, the cell's line): about twenty frames that bury the one line saying
where the user's code is. ``Launch.dump_stacks``, the dashboard and a timeout's message fold them into one
line; the whole dump stays available (``.full``, ``LaunchTimeout.stacks``).
"""
from __future__ import annotations

import json
import re
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

from scripts import script_env

pytestmark = pytest.mark.timeout(300)

CELL = """
import json, threading, time
from notebook_accel import LaunchTimeout, last_launch, notebook_launcher

def user_waits_here():
    time.sleep(120)

def train():
    user_waits_here()

dumped = {}

def dump_when_both_wait():  # from another thread: the cell's own thread is in notebook_launcher
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        launch = last_launch()
        stacks = launch.dump_stacks() if launch is not None else {}
        if len(stacks) == 2 and all("user_waits_here" in text for text in stacks.values()):
            full = launch.dump_stacks(full=True)
            dumped.update({rank: {"shown": text, "full": full.get(rank)} for rank, text in stacks.items()})
            return
        time.sleep(0.5)

threading.Thread(target=dump_when_both_wait, daemon=True).start()
try:
    notebook_launcher(train, num_processes=2, start_method="fork", timeout=10, display="none")
except LaunchTimeout as error:
    timeout_message, timeout_stacks = str(error), error.stacks
print("STACKS " + json.dumps({"dumped": dumped, "timeout": timeout_message, "timeout_stacks": timeout_stacks}))
"""

KERNEL_FRAMES = re.compile(r"/(IPython|ipykernel|tornado|asyncio|zmq|traitlets)/|\bin <module>$", re.MULTILINE)


def test_a_forked_ranks_stack_dump_shows_the_users_frame_not_the_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])  # the notebook_accel under test
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(CELL).strip())])
    client = NotebookClient(notebook, timeout=240, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(output.get("text", "") + "\n".join(output.get("traceback", []))
                   for output in notebook.cells[0].outputs)
    assert "STACKS " in text, text[-3000:]
    seen = json.loads(text.split("STACKS ", 1)[1].splitlines()[0])

    assert sorted(seen["dumped"]) == ["0", "1"], seen["dumped"]
    for rank, dump in seen["dumped"].items():
        shown, full = dump["shown"], dump["full"]
        assert "in user_waits_here" in shown and "in train" in shown, shown
        assert not KERNEL_FRAMES.search(shown), f"rank {rank}'s dump shows the kernel's frames:\n{shown}"
        assert re.search(r"\[\d+ frames .*folded", shown), shown  # said, not silently dropped
        assert full is not None and "/ipykernel/" in full and "in user_waits_here" in full  # all kept

    message = seen["timeout"]
    assert message.count("in user_waits_here") == 2, message
    assert not KERNEL_FRAMES.search(message), f"the timeout's message shows the kernel's frames:\n{message}"
    assert all("/ipykernel/" in dump for dump in seen["timeout_stacks"].values())  # .stacks: the whole dumps
