"""The debugging dashboard in a real Jupyter kernel (nbclient), with real ranks: resources, a stalled rank,
finished loops, the metrics table in the saved notebook, and a traceback that starts in the user's code."""
from __future__ import annotations

import re

import pytest

from scripts import PACKAGE_ROOT
from test_dashboard_kernel import RecordingClient, WidgetTraffic

import nbformat
import textwrap

SETUP = f"""
    import sys, time, os
    sys.path.insert(0, {PACKAGE_ROOT!r})
    from notebook_accel import notebook_launcher, progress, report
"""

# Rank 1 holds 500 MiB and sleeps 14 s without progress while rank 0 runs three 4-s epochs (leave=True):
# rank 1 must be marked stalled, both rows show memory, finished epochs stay as summary lines.
STALL_AND_MEMORY = """
    def train():
        import torch
        rank = int(os.environ["RANK"])
        if rank == 1:
            block = torch.ones(500 * 2 ** 20 // 4)
            print("rank 1 holds 500 MiB and sleeps", flush=True)
            time.sleep(14)
            return "slept"
        step = 0
        for epoch in range(3):
            for i in progress(range(40), desc=f"epoch {epoch}"):
                time.sleep(0.1)
                report(step=step, loss=1000.0 * 10 ** (-6 * step / 119))
                step += 1
        return "ok"

    print("result", notebook_launcher(train, num_processes=2))
"""

FAILS = """
    def user_step(batch):
        raise ValueError(f"bad batch {batch}")

    def train_fails():
        for batch in range(3):
            if int(os.environ["RANK"]) == 1 and batch == 2:
                user_step(batch)
        return "ok"

    notebook_launcher(train_fails, num_processes=2)
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(src))
                                         for src in (SETUP, STALL_AND_MEMORY, FAILS)])
    client = RecordingClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                             resources={"metadata": {"path": str(tmp_path_factory.mktemp("debug"))}})
    client.execute()
    return client


def labels_over_time(messages, rank):
    """Every value the rank's label took, in order (from comm_open and update messages)."""
    values, label_comms = [], set()
    for msg in messages:
        content = msg["content"]
        state = content.get("data", {}).get("state", {}) if msg["msg_type"] in ("comm_open", "comm_msg") else {}
        value = state.get("value", "")
        if not isinstance(value, str):
            continue
        if f"rank {rank}</b>" in value and "notebook-accel-rank-label" in value:
            label_comms.add(content["comm_id"])
        if content.get("comm_id") in label_comms and value:
            values.append(value)
    return values


@pytest.mark.timeout(300)
def test_rows_show_plausible_memory_and_cpu(executed):
    messages = executed.messages[1]
    mib = {}
    for rank in (0, 1):
        figures = [float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)
                   for label in labels_over_time(messages, rank)
                   for m in [re.search(r"RSS ([\d.]+) (MiB|GiB)", label)] if m]
        assert figures, f"no memory figure in rank {rank}'s label"
        mib[rank] = max(figures)
        assert any(re.search(r"CPU \d+%", label) for label in labels_over_time(messages, rank))
    assert mib[1] > 500 and mib[1] - mib[0] > 400, mib  # the rank holding 500 MiB shows it
    header = [state["value"] for state in WidgetTraffic(messages).models("HTMLModel").values()
              if "notebook-accel-header" in state.get("value", "")]
    assert header and "RSS" in header[0]


@pytest.mark.timeout(300)
def test_the_sleeping_rank_was_marked_stalled_while_its_peer_advanced(executed):
    stalled = [label for label in labels_over_time(executed.messages[1], 1) if "no progress for" in label]
    assert stalled, labels_over_time(executed.messages[1], 1)[-3:]
    assert "last output" in stalled[0]
    assert not any("no progress" in label for label in labels_over_time(executed.messages[1], 0))


@pytest.mark.timeout(300)
def test_finished_epochs_stay_as_summary_lines_and_the_table_is_saved(executed):
    traffic = WidgetTraffic(executed.messages[1])
    done = [state["value"] for state in traffic.models("HTMLModel").values()
            if "notebook-accel-finished" in state.get("value", "")]
    assert done and "epoch 0: 40/40" in done[0] and "epoch 1: 40/40" in done[0], done
    assert "result ok" in traffic.streams["stdout"]
    # the saved notebook keeps a plain last/min/max table (GitHub and nbconvert show it without widgets)
    outputs = executed.nb.cells[1].outputs
    tables = [o["data"] for o in outputs if o.get("output_type") == "display_data"
              and "text/html" in o["data"] and "notebook-accel-metrics" in o["data"]["text/html"]]
    assert len(tables) == 1 and "metrics:" in tables[0]["text/plain"] and "loss" in tables[0]["text/plain"]
    assert re.search(r"loss +0 +0.001 +0.001 +1000 +120", tables[0]["text/plain"]), tables[0]["text/plain"]


@pytest.mark.timeout(300)
def test_the_error_shown_in_the_cell_starts_in_the_users_function(executed):
    errors = [o for o in executed.nb.cells[2].outputs if o.get("output_type") == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "ValueError"
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errors[0]["traceback"]))
    remote = text[:text.index("The above exception was the direct cause")]
    frames = re.findall(r'File "[^"]*", line \d+, in (\w+)', remote)
    assert frames == ["train_fails", "user_step"], remote
    assert "notebook_accel/" not in remote  # no frame of the package (rank/run.py, ...) above the user's
    # none of the launcher's own kernel-side frames: the user's call, then the message (outcome/shown.py)
    kernel_side = text[text.index("The above exception was the direct cause"):]
    ours = re.findall(r"notebook_accel/[\w/]+\.py:\d+, in (\w+)", kernel_side)
    assert ours == [] and "def run(" not in kernel_side, kernel_side
