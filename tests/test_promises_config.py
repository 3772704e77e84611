"""Promises of docs/cli.md about saved launch defaults that no other test exercised (issue 17 §3, item 7):

* ``notebook_launcher(..., config=True)`` fills the options left at their defaults from the default file (ours,
  else accelerate's); ``launch_panel(..., config=True)`` presets the pickers from it.
* ``NOTEBOOK_ACCEL_CONFIG_FILE`` names another file: ``notebook-accel config`` writes there, ``launch`` and
  ``config=True`` read it.
* accelerate's ``default_config.yaml`` with ``num_machines > 1``: its total ``num_processes`` is divided by
  ``num_machines``, and its machine rank and main process address make a multi-node launch.

(tests/test_cli.py covers ``config="path.yaml"``, the questionnaire, and accelerate's file with one machine.)
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from notebook_accel import launch_panel, notebook_launcher
from scripts import script_env

pytestmark = pytest.mark.timeout(300)


def world_and_precision():
    return os.environ["WORLD_SIZE"], os.environ["ACCELERATE_MIXED_PRECISION"]


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A private Hugging Face cache: the default config files live under it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("NOTEBOOK_ACCEL_CONFIG_FILE", raising=False)
    return tmp_path / "hf"


def write_yaml(path, values):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    return path


def accelerate_config(hf, **values):
    return write_yaml(hf / "accelerate" / "default_config.yaml", {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "use_cpu": True,
        "mixed_precision": "no", "num_machines": 1, "machine_rank": 0, **values})


def test_config_true_reads_our_default_file_only_when_asked(hf_home):
    write_yaml(hf_home / "notebook_accel" / "default_config.yaml",
               {"num_processes": 2, "device": "cpu", "mixed_precision": "bf16"})
    assert notebook_launcher(world_and_precision, display="none") == ("1", "no")  # not asked: ignored
    assert notebook_launcher(world_and_precision, display="none", config=True) == ("2", "bf16")
    assert notebook_launcher(world_and_precision, display="none", config=True, mixed_precision="no") == ("2", "no")


def test_config_true_falls_back_to_accelerates_file(hf_home):
    accelerate_config(hf_home, num_processes=2, mixed_precision="bf16")
    assert notebook_launcher(world_and_precision, display="none", config=True) == ("2", "bf16")


def test_the_config_file_variable_is_where_config_writes_and_every_reader_reads(hf_home, tmp_path, monkeypatch):
    # A file at the default place says otherwise: only the variable's file may be read.
    write_yaml(hf_home / "notebook_accel" / "default_config.yaml", {"num_processes": 1, "mixed_precision": "no"})
    elsewhere = tmp_path / "team" / "launch.yaml"
    monkeypatch.setenv("NOTEBOOK_ACCEL_CONFIG_FILE", str(elsewhere))
    env = script_env()
    written = subprocess.run([sys.executable, "-m", "notebook_accel.cli", "config", "default", "--mixed-precision",
                              "bf16"], env=env, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0 and str(elsewhere) in written.stdout, written.stdout + written.stderr
    saved = yaml.safe_load(elsewhere.read_text())
    assert saved["mixed_precision"] == "bf16"
    write_yaml(elsewhere, {**saved, "num_processes": 2})
    assert notebook_launcher(world_and_precision, display="none", config=True) == ("2", "bf16")
    (tmp_path / "job.py").write_text("import os\nprint('WORLD', os.environ['WORLD_SIZE'], "
                                     "os.environ['ACCELERATE_MIXED_PRECISION'], flush=True)\n")
    launched = subprocess.run([sys.executable, "-m", "notebook_accel.cli", "launch", str(tmp_path / "job.py")],
                              env=env, capture_output=True, text=True, timeout=120)
    assert launched.returncode == 0, launched.stderr
    assert sorted(line for line in launched.stdout.splitlines() if "WORLD" in line) == [
        "[rank 0] WORLD 2 bf16", "[rank 1] WORLD 2 bf16"], launched.stdout
    environment = subprocess.run([sys.executable, "-m", "notebook_accel.cli", "env"], env=env, capture_output=True,
                                 text=True, timeout=120)
    assert str(elsewhere) in environment.stdout, environment.stdout


def test_launch_panel_config_true_presets_the_pickers_and_the_launch(hf_home):
    # On CPU the panel's own default is 2 processes and "no": the file's 1 and bf16 are told apart from them.
    write_yaml(hf_home / "notebook_accel" / "default_config.yaml",
               {"num_processes": 1, "device": "cpu", "mixed_precision": "bf16", "start_method": "spawn"})
    plain = launch_panel(world_and_precision)
    assert (plain.num_processes, plain.mixed_precision) == (2, "no")  # not asked: the file is ignored
    panel = launch_panel(world_and_precision, config=True)
    assert (panel.device, panel.num_processes, panel.mixed_precision) == ("cpu", 1, "bf16")
    job = panel.launch()
    assert panel.wait(120) == ("1", "bf16")
    assert job.plan.start_method == "spawn"  # the file's other options reach the launch too
    given = launch_panel(world_and_precision, config=True, mixed_precision="no")
    assert given.mixed_precision == "no"  # what the notebook wrote wins


def test_accelerates_multi_machine_file_makes_a_multi_node_launch(tmp_path):
    # Two "machines" on localhost, each with accelerate's file for its machine_rank: 4 processes in total.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "job.py").write_text("import os\nprint('RANK', os.environ['RANK'], 'OF', os.environ['WORLD_SIZE'], "
                                     "'LOCAL', os.environ['LOCAL_WORLD_SIZE'], flush=True)\n")
    nodes = []
    for machine in (0, 1):
        hf = tmp_path / f"machine{machine}"
        accelerate_config(hf, num_processes=4, num_machines=2, machine_rank=machine,
                          main_process_ip="127.0.0.1", main_process_port=port, rdzv_backend="static",
                          same_network=True)
        env = script_env()
        env.update(HF_HOME=str(hf), GLOO_SOCKET_IFNAME="lo")
        env.pop("NOTEBOOK_ACCEL_CONFIG_FILE", None)
        nodes.append(subprocess.Popen([sys.executable, "-m", "notebook_accel.cli", "launch", str(tmp_path / "job.py")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for node in nodes:
        try:
            outputs.append(node.communicate(timeout=180))
        except subprocess.TimeoutExpired:
            for started in nodes:
                started.kill()
                started.communicate()
            raise
    assert [node.returncode for node in nodes] == [0, 0], outputs
    for machine, (out, _) in enumerate(outputs):
        ranks = sorted(line for line in out.splitlines() if " RANK " in line)
        first = 2 * machine
        assert ranks == [f"[rank {rank}] RANK {rank} OF 4 LOCAL 2" for rank in (first, first + 1)], out
        assert f"node rank {machine} of 2" in out
