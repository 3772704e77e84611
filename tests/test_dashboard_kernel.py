"""The dashboard in a real Jupyter kernel (nbclient): what the frontend receives over IOPub.

One notebook, two launches of 2 ranks each — one loop with ``progress``, one with plain ``tqdm.auto``
imported at the top of the notebook (before any patch) — and every IOPub message recorded per cell.
"""
from __future__ import annotations

import json
import os
import textwrap
from collections import defaultdict
from typing import Any, Dict, List

import nbformat
import pytest
from nbclient import NotebookClient

from scripts import PACKAGE_ROOT
LOOP = 100_000


class RecordingClient(NotebookClient):
    """nbclient that keeps every IOPub message of every cell (``messages[cell_index]``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: Dict[int, List[dict]] = defaultdict(list)

    def process_message(self, msg, cell, cell_index):  # type: ignore[override]
        self.messages[cell_index].append(msg)
        return super().process_message(msg, cell, cell_index)


def run_notebook(cells: List[str], tmp_path, timeout: int = 180) -> RecordingClient:
    """Execute ``cells`` in a fresh python3 kernel that can import notebook_accel; return the client."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(src)) for src in cells])
    client = RecordingClient(nb, timeout=timeout, kernel_name="python3",
                             resources={"metadata": {"path": str(tmp_path)}})
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = PACKAGE_ROOT + (os.pathsep + old if old else "")
    try:
        client.execute()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return client


def sent_at(msg: dict) -> float:
    """When the kernel sent ``msg`` (its header's date), in seconds since the epoch."""
    date = msg["header"]["date"]
    if isinstance(date, str):  # a client that leaves dates unparsed
        from datetime import datetime

        date = datetime.fromisoformat(date.replace("Z", "+00:00"))
    return date.timestamp()


class WidgetTraffic:
    """Widget models opened in a cell and the updates each received, rebuilt from IOPub messages."""

    def __init__(self, messages: List[dict]) -> None:
        self.state: Dict[str, dict] = {}
        self.updates: Dict[str, int] = defaultdict(int)
        self.opened_at: Dict[str, float] = {}      # comm id -> IOPub time (s) of its comm_open
        self.last_update_at: Dict[str, float] = {}
        self.display_texts: List[str] = []
        self.streams: Dict[str, str] = defaultdict(str)
        for msg in messages:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
                self.state[content["comm_id"]] = dict(content["data"]["state"])
                self.opened_at[content["comm_id"]] = sent_at(msg)
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                comm = content["comm_id"]
                self.state.setdefault(comm, {}).update(content["data"]["state"])
                self.updates[comm] += 1
                self.last_update_at[comm] = sent_at(msg)
            elif kind in ("display_data", "update_display_data"):
                self.display_texts.append(content["data"].get("text/plain", ""))
            elif kind == "stream":
                self.streams[content["name"]] += content["text"]

    def lifetime(self, comm: str) -> float:
        """Seconds from the widget's creation to its last update, as the kernel stamped the messages."""
        return self.last_update_at.get(comm, self.opened_at[comm]) - self.opened_at[comm]

    def assert_rate_within_promise(self, comm: str, what: str) -> None:
        """docs/dashboard.md: "under 10 widget messages a second per bar". Over the widget's life, plus a few
        messages not paced by the throttle (the first draw, the closing exact value and style)."""
        updates, seconds = self.updates[comm], self.lifetime(comm)
        assert updates <= 10 * seconds + 4, f"{what}: {updates} update messages in {seconds:.2f} s"

    def models(self, name: str) -> Dict[str, dict]:
        return {comm: state for comm, state in self.state.items() if state.get("_model_name") == name}

    def bars(self, desc: str) -> Dict[str, dict]:
        return {comm: state for comm, state in self.models("FloatProgressModel").items()
                if state.get("description") == desc}


SETUP = f"""
    import sys, time, math
    sys.path.insert(0, {PACKAGE_ROOT!r})
    from tqdm.auto import tqdm          # bound BEFORE any launch patches tqdm: must still report
    from notebook_accel import notebook_launcher, progress, report
"""

# 100 short sleeps spread over the loop: ~1.5 s, so the rank sends ~15 bar states and the kernel throttles.
TRAIN_PROGRESS = f"""
    def train_progress(n):
        import os
        print("hello from rank", os.environ["RANK"])
        for i in progress(range(n), desc="progress-loop"):
            if i % 1000 == 0:
                time.sleep(0.015)
                report(step=i, loss=1.0 / (1 + i / 1000), lr=0.1)
        return "ok"

    notebook_launcher(train_progress, args=({LOOP},), num_processes=2)
"""

TRAIN_TQDM = f"""
    def train_tqdm(n):
        for i in tqdm(range(n), desc="tqdm-loop"):
            if i % 1000 == 0:
                time.sleep(0.015)
        return "ok"

    notebook_launcher(train_tqdm, args=({LOOP},), num_processes=2)
"""


TRAIN_FAILS = """
    def train_fails():
        import os
        rank = int(os.environ["RANK"])
        for i in progress(range(50), desc="doomed"):
            time.sleep(0.01 if rank == 1 else 0.2)  # rank 0 is mid-loop when it is stopped, however loaded
            if rank == 1 and i == 20:
                raise ValueError("rank one gives up")
        time.sleep(30)  # rank 0 is stopped by the launcher long before this ends

    try:
        notebook_launcher(train_fails, num_processes=2)
    except ValueError as error:
        print("raised:", error)
"""


INLINE = """
    print("inline result", notebook_launcher(train_progress, args=(20_000,), num_processes=1))
    # after the launch the kernel's own tqdm.auto is the notebook widget bar again
    from tqdm.auto import tqdm as kernel_tqdm
    bar = kernel_tqdm(range(3), desc="kernel-bar")
    list(bar)
    print("kernel bar", type(bar).__module__, hasattr(bar, "container"))
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    return run_notebook([SETUP, TRAIN_PROGRESS, TRAIN_TQDM, TRAIN_FAILS, INLINE], tmp_path_factory.mktemp("kernel"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cell, desc", [(1, "progress-loop"), (2, "tqdm-loop")])
def test_one_bar_per_rank_exact_final_value_few_messages(executed, cell, desc):
    traffic = WidgetTraffic(executed.messages[cell])
    bars = traffic.bars(desc)
    assert len(bars) == 2, f"expected one {desc} bar per rank, got {len(bars)}: {bars}"
    for comm, state in bars.items():
        assert state["max"] == LOOP and state["value"] == LOOP, state
        assert state["bar_style"] == "success", state
        traffic.assert_rate_within_promise(comm, f"{desc} bar")
    # the right-hand text (n/total, rate, ETA) is throttled the same way and ends exact
    texts = {comm: state for comm, state in traffic.models("HTMLModel").items()
             if f"{LOOP // 1000}k/{LOOP // 1000}k" in state.get("value", "")
             or f"{LOOP}/{LOOP}" in state.get("value", "")}
    assert len(texts) == 2, [s.get("value") for s in traffic.models("HTMLModel").values()]
    for comm in texts:
        traffic.assert_rate_within_promise(comm, f"{desc} bar's text")


@pytest.mark.timeout(240)
def test_reported_metrics_reach_the_plot(executed):
    traffic = WidgetTraffic(executed.messages[1])
    plots = {comm: state["value"] for comm, state in traffic.models("HTMLModel").items()
             if "<svg" in state.get("value", "")}
    by_name = {name: svg for svg in plots.values() for name in ("loss", "lr") if f'aria-label="{name} per rank"' in svg}
    assert set(by_name) == {"loss", "lr"}, list(plots.values())[:1]
    loss = by_name["loss"]
    assert 'data-rank="0"' in loss and 'data-rank="1"' in loss  # one line per rank
    assert "rank 0:" in loss and "rank 1:" in loss              # legend
    assert "<polyline" in loss and ">step<" in loss             # axes label, lines
    # the bar's postfix shows the latest metrics
    texts = [state["value"] for state in traffic.models("HTMLModel").values() if "loss=" in state.get("value", "")]
    assert len(texts) == 2


@pytest.mark.timeout(240)
def test_saved_outputs_are_readable_without_widgets(executed):
    traffic = WidgetTraffic(executed.messages[1])
    # rank output is plain, labelled stream output of the cell (kept in the notebook, shown on GitHub)
    assert "[rank 0] hello from rank 0" in traffic.streams["stdout"]
    assert "[rank 1] hello from rank 1" in traffic.streams["stdout"]
    # the last text/plain of the dashboard is the final summary, not a frozen 0%
    final = traffic.display_texts[-1]
    assert "finished" in final and final.count(f"{LOOP // 1000}k/{LOOP // 1000}k") + final.count(
        f"{LOOP}/{LOOP}") == 2, final
    # the executed notebook stores it as the output's text/plain
    outputs = executed.nb.cells[1].outputs
    plain = [o["data"]["text/plain"] for o in outputs if o.get("output_type") == "display_data"
             and o["data"]["text/plain"].startswith("notebook_accel:")]  # the dashboard's (not the metrics table)
    assert plain and "finished" in plain[-1]
    assert "100%" in plain[-1] and " 0%" not in plain[-1]


@pytest.mark.timeout(240)
def test_failure_marks_the_root_cause_row_and_shows_the_traceback(executed):
    traffic = WidgetTraffic(executed.messages[3])
    assert "raised: rank one gives up" in traffic.streams["stdout"]
    labels = [state["value"] for state in traffic.models("HTMLModel").values()
              if "notebook-accel-rank-label" in state.get("value", "")]
    root = [label for label in labels if "rank 1</b>" in label]
    assert root and "root cause" in root[0] and "failed" in root[0], labels
    assert not any("root cause" in label for label in labels if "rank 0</b>" in label)
    errors = [state["value"] for state in traffic.models("HTMLModel").values() if "<details" in state.get("value", "")]
    assert any("ValueError: rank one gives up" in error and "train_fails" in error for error in errors), errors
    boxes = [state for state in traffic.models("VBoxModel").values()
             if "notebook-accel-rank" in state.get("_dom_classes", [])]
    assert len(boxes) == 2
    bars = traffic.bars("doomed")
    assert sorted(state["bar_style"] for state in bars.values()) == ["danger", "warning"], bars
    final = traffic.display_texts[-1]
    assert "failed" in final and "root cause" in final and "ValueError" in final, final


@pytest.mark.timeout(240)
def test_one_process_runs_inline_with_the_same_dashboard(executed):
    traffic = WidgetTraffic(executed.messages[4])
    out = traffic.streams["stdout"]
    assert "inline result ok" in out and "[rank 0] hello from rank 0" in out
    bars = traffic.bars("progress-loop")
    assert len(bars) == 1 and all(state["value"] == state["max"] == 20_000 for state in bars.values())
    assert "kernel bar tqdm.auto True" in out  # the patch was undone


def test_widget_traffic_parser_counts_updates():
    messages = [
        {"msg_type": "comm_open", "header": {"date": "2025-01-01T00:00:00.000000Z"},
         "content": {"target_name": "jupyter.widget", "comm_id": "a",
                     "data": {"state": {"_model_name": "FloatProgressModel", "description": "x", "value": 0}}}},
        {"msg_type": "comm_msg", "header": {"date": "2025-01-01T00:00:01.500000Z"},
         "content": {"comm_id": "a", "data": {"method": "update", "state": {"value": 3}}}},
    ]
    traffic = WidgetTraffic(messages)
    assert traffic.bars("x") == {"a": {"_model_name": "FloatProgressModel", "description": "x", "value": 3}}
    assert traffic.updates["a"] == 1 and traffic.lifetime("a") == 1.5
    traffic.assert_rate_within_promise("a", "x")
    traffic.updates["a"] = 20  # 20 in 1.5 s: 13 a second
    with pytest.raises(AssertionError, match="20 update messages in 1.50 s"):
        traffic.assert_rate_within_promise("a", "x")
    json.dumps(traffic.state)
