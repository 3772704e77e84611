"""The launch panel: driven from code in a real kernel (nbclient), and its settings checked without one."""
from __future__ import annotations

import re

import pytest

from notebook_accel import LaunchConfigError, LaunchConfigTypeError, launch_panel
from notebook_accel.plan.devices import available_devices
from notebook_accel.panel import LaunchPanel
from scripts import PACKAGE_ROOT
from test_dashboard_kernel import WidgetTraffic, run_notebook

SETUP = f"""
    import sys, time, psutil
    sys.path.insert(0, {PACKAGE_ROOT!r})
    from notebook_accel import launch_panel, progress, report

    def quick(n):
        import os
        for i in progress(range(n), desc="quick"):
            time.sleep(0.005)
            report(loss=1.0 / (i + 1))
        return int(os.environ["RANK"]) + 100

    def long_run():
        for i in progress(range(100_000), desc="long"):
            time.sleep(0.01)

    def rank_pids():
        return sorted(p.pid for p in psutil.Process().children(recursive=True)
                      if "forkserver" not in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline()))
"""

FROM_CODE = """
    panel = launch_panel(quick, args=(40,))
    display(panel)
    panel.num_processes = 2
    panel.launch()
    print("RESULT", panel.wait(60), panel.status, panel.error)
    print("SUMMARY", panel.view.summary().replace(chr(10), " | "))
"""

START_LONG = """
    stopper = launch_panel(long_run, num_processes=2)
    stopper.launch_button.click()          # the button path: returns at once, the launch runs in background
    time.sleep(2.5)
    pids = rank_pids()
    print("STARTED", len(pids), stopper.running)
"""

KERNEL_IS_FREE = """
    print("FREE", 6 * 7, stopper.running)  # runs while the launch is still going
"""

STOP = """
    stopper.stop_button.click()
    try:
        stopper.wait(30)
    except KeyboardInterrupt:
        print("INTERRUPTED")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [p for p in pids if psutil.pid_exists(p)
                                           and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    print("ALIVE", alive, "LEFT", rank_pids(), type(stopper.error).__name__, stopper.status)
    print("BUTTONS", stopper.launch_button.disabled, stopper.stop_button.disabled)
"""


def _stdout(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.get("output_type") == "stream")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    return run_notebook([SETUP, FROM_CODE, START_LONG, KERNEL_IS_FREE, STOP], tmp_path_factory.mktemp("panel"))


@pytest.mark.timeout(240)
def test_panel_driven_from_code_returns_the_result(executed):
    out = _stdout(executed.nb.cells[1])
    assert "RESULT 100 finished None" in out, out
    assert "40/40" in out and "[rank 1] finished" in out
    traffic = WidgetTraffic(executed.messages[1])
    # the panel shows the devices and the pickers, and the dashboard under it
    sliders = traffic.models("IntSliderModel")
    assert any(state["value"] == 2 and state["description"] == "processes" for state in sliders.values())
    assert any("Devices here" in state.get("value", "") for state in traffic.models("HTMLModel").values())
    assert len(traffic.bars("quick")) == 2
    assert all(state["value"] == 40 for state in traffic.bars("quick").values())
    # the saved text/plain of the panel was refreshed to the outcome
    plain = [o["data"]["text/plain"] for o in executed.nb.cells[1].outputs if o.get("output_type") == "display_data"]
    assert plain and "finished" in plain[-1] and plain[-1].count("40/40") == 2, plain


@pytest.mark.timeout(240)
def test_kernel_stays_usable_and_stop_leaves_no_process(executed):
    started = _stdout(executed.nb.cells[2])
    assert re.search(r"STARTED [2-9]\d* True", started), started
    assert "FREE 42 True" in _stdout(executed.nb.cells[3])
    out = _stdout(executed.nb.cells[4])
    assert "INTERRUPTED" in out, out
    assert "ALIVE [] LEFT [] KeyboardInterrupt stopped" in out, out
    assert "BUTTONS False True" in out  # Launch enabled again, Stop disabled


def test_panel_settings_are_checked():
    panel = launch_panel(print, args=("x",))
    assert isinstance(panel, LaunchPanel)
    devices = available_devices()
    assert devices[-1].kind == "cpu"
    assert panel.device == devices[0].kind
    assert panel.processes_picker.max == devices[0].count
    with pytest.raises(LaunchConfigError, match="num_processes"):
        panel.num_processes = devices[0].count + 1
    with pytest.raises(LaunchConfigError, match="mixed_precision"):
        panel.mixed_precision = "fp64"
    panel.mixed_precision = "bf16"
    assert panel.precision_picker.value == "bf16"
    assert panel.status == "idle" and panel.result is None and panel.error is None and not panel.running
    with pytest.raises(RuntimeError, match="nothing was launched"):
        panel.wait()
    assert "LaunchPanel(print" in panel._repr_mimebundle_()["text/plain"]
    with pytest.raises(LaunchConfigTypeError, match="^launch_panel: unexpected keyword argument 'display'"):
        launch_panel(print, display="text")
    with pytest.raises(LaunchConfigError, match="^launch_panel: mixed_precision='fp64' is not one of"):
        launch_panel(print, mixed_precision="fp64")  # was a plain ValueError


def launched_settings():
    import os

    return {name: os.environ[name] for name in ("WORLD_SIZE", "NOTEBOOK_ACCEL_DEVICE", "ACCELERATE_MIXED_PRECISION")}


def test_panel_presets_come_from_launcher_options_and_reach_the_launch():
    panel = launch_panel(launched_settings, num_processes=1, mixed_precision="bf16", device="cpu")
    assert (panel.processes_picker.value, panel.precision_picker.value, panel.device_picker.value) == (1, "bf16", "cpu")
    panel.launch()
    # what the ranks were launched with, not what the panel says
    assert panel.wait(60) == {"WORLD_SIZE": "1", "NOTEBOOK_ACCEL_DEVICE": "cpu", "ACCELERATE_MIXED_PRECISION": "bf16"}


def test_the_panel_neither_offers_nor_accepts_fp16_on_cpu_as_the_launcher_refuses_it():
    from notebook_accel.errors import LaunchConfigError
    from notebook_accel.plan.options import precisions_for

    refused = "mixed_precision='fp16' needs CUDA; on CPU use 'bf16'"  # the launcher's own message
    with pytest.raises(LaunchConfigError, match=re.escape(refused)):
        launch_panel(print, device="cpu", mixed_precision="fp16")
    panel = launch_panel(print, device="cpu")
    assert "fp16" not in panel.precision_picker.options
    assert tuple(panel.precision_picker.options) == precisions_for("cpu") == ("no", "bf16")
    with pytest.raises(LaunchConfigError, match=re.escape(refused)):
        panel.mixed_precision = "fp16"
    assert panel.mixed_precision == "no"


def test_switching_the_device_offers_what_it_can_train_in(monkeypatch):
    # No GPU here: the panel is shown a CUDA device next to the CPU (it is never launched on).
    import notebook_accel.panel as panel_module
    from notebook_accel.plan.devices import DeviceInfo

    monkeypatch.setattr(panel_module, "available_devices",
                        lambda: [DeviceInfo("cuda", 2, "2 × a stand-in GPU"), DeviceInfo("cpu", 2, "2 cores")])
    panel = launch_panel(print, mixed_precision="fp16")
    assert panel.device == "cuda" and "fp16" in panel.precision_picker.options
    panel.device = "cpu"
    assert "fp16" not in panel.precision_picker.options and panel.mixed_precision == "no"
    panel.device = "cuda"
    panel.mixed_precision = "bf16"
    panel.device = "cpu"
    assert panel.mixed_precision == "bf16"  # a choice the new device can keep is kept
