"""Attaching to a detached launch in real Jupyter kernels (nbclient), on the run's fake two-node Ray cluster.

One kernel starts a detached 2-rank launch and ends (its ranks wait meanwhile, halfway through); a second kernel
attaches by id while the job still runs: the cell shows the ordinary dashboard widget — first the lines so far,
replayed, then (once the test has seen them and lets the ranks go on) the rest live — and the cell's value is the
result. A ``DetachedJob`` handle as a cell's last expression shows the same dashboard.

What the frontend got is read from IOPub, as test_dashboard_kernel.py reads it.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any, Callable, List, Optional

import nbformat
import pytest

from test_dashboard_kernel import RecordingClient, WidgetTraffic, sent_at
from scripts import PACKAGE_ROOT
from test_ray_detached import WORK, ray  # noqa: F401  (ray: the fixture that checks no job, actor or driver is left)

pytestmark = pytest.mark.timeout(300)

BEFORE = [f"[rank {rank}] rank {rank} step {step} before" for rank in (0, 1) for step in range(3)]
AFTER = [f"[rank {rank}] rank {rank} step {step} after" for rank in (0, 1) for step in range(3, 6)]


class WatchingClient(RecordingClient):
    """Records every IOPub message; ``on_message(cell_index, messages so far of that cell)`` after each one."""

    def __init__(self, *args: Any, on_message: Optional[Callable[[int, List[dict]], None]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_message = on_message

    def process_message(self, msg, cell, cell_index):  # type: ignore[override]
        result = super().process_message(msg, cell, cell_index)
        if self.on_message is not None:
            self.on_message(cell_index, self.messages[cell_index])
        return result


def run_kernel(cells: List[str], tmp_path: Path, **options: Any) -> WatchingClient:
    """Execute ``cells`` in a fresh python3 kernel that imports this checkout's notebook_accel; the client after."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(src)) for src in cells])
    client = WatchingClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}, **options)
    client.execute()
    return client


def connect(address: str) -> str:
    return textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {PACKAGE_ROOT!r})
        import ray
        ray.init(address={address!r})
        import notebook_accel
    """)


def stdout_of(client: WatchingClient, cell: int) -> str:
    return "".join(msg["content"]["text"] for msg in client.messages[cell]
                   if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout")


def value_of(client: WatchingClient, cell: int) -> str:
    (value,) = [msg["content"]["data"]["text/plain"] for msg in client.messages[cell]
                if msg["msg_type"] == "execute_result"]
    return value


def assert_the_dashboard_of_a_finished_job(traffic: WidgetTraffic) -> None:
    """Every rank's row, labelled finished, the rank's lines in the cell, and a final summary saying finished."""
    rows = [state for state in traffic.models("VBoxModel").values()
            if "notebook-accel-rank" in state.get("_dom_classes", [])]
    assert len(rows) == 2, traffic.models("VBoxModel")
    labels = sorted(state["value"] for state in traffic.models("HTMLModel").values()
                    if "notebook-accel-rank-label" in state.get("value", ""))
    assert len(labels) == 2 and all("finished" in label for label in labels), labels
    assert "rank 0</b>" in labels[0] and "rank 1</b>" in labels[1], labels
    for line in BEFORE + AFTER:
        assert line in traffic.streams["stdout"], (line, traffic.streams["stdout"])
    assert traffic.display_texts and "finished" in traffic.display_texts[-1], traffic.display_texts


def test_a_second_kernel_attaches_replayed_then_live_and_a_handle_displays_the_dashboard(ray, fake_ray,  # noqa: F811
                                                                                          tmp_path):
    ready, go = str(tmp_path / "ready"), tmp_path / "go"
    starting = run_kernel([connect(fake_ray.cluster.address) + textwrap.dedent(WORK), f"""
        import os, time
        job = notebook_accel.start_launch(work, args=({ready!r}, {str(go)!r}), num_processes=2, cluster="ray",
                                          placement="STRICT_SPREAD", detach=True)
        while not all(os.path.exists(f"{ready}.{{rank}}") for rank in (0, 1)):
            time.sleep(0.05)
        print("JOB", job.id)
    """], tmp_path)
    job_id = stdout_of(starting, 1).split()[1]  # the first kernel has ended; its job waits, halfway through

    went_at: List[float] = []

    def let_the_ranks_go_once_the_replay_is_shown(cell: int, messages: List[dict]) -> None:
        if cell == 1 and not went_at and all(line in WidgetTraffic(messages).streams["stdout"] for line in BEFORE):
            go.touch()
            went_at.append(os.path.getmtime(go))

    attaching = run_kernel([connect(fake_ray.cluster.address), f"notebook_accel.attach({job_id!r})",
                            f"notebook_accel.DetachedJob({job_id!r})"], tmp_path,
                           on_message=let_the_ranks_go_once_the_replay_is_shown)
    assert went_at, "the attaching cell never showed the lines the ranks had printed before it"
    assert value_of(attaching, 1) == "{'rank': 0, 'steps': 6}"
    attached = WidgetTraffic(attaching.messages[1])
    assert_the_dashboard_of_a_finished_job(attached)
    # replayed, then live: the lines after the go came after it (the ranks could not print them before)
    after_sent = [sent_at(msg) for msg in attaching.messages[1] if msg["msg_type"] == "stream"
                  and any(line in msg["content"]["text"] for line in AFTER)]
    assert after_sent and min(after_sent) >= went_at[0] - 1.0, (after_sent, went_at)

    displayed = WidgetTraffic(attaching.messages[2])  # the handle as the cell's value: the same dashboard, replayed
    assert_the_dashboard_of_a_finished_job(displayed)

    from notebook_accel import DetachedJob

    DetachedJob(job_id).forget()
