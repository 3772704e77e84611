"""An FSDP or DeepSpeed default saved by ``notebook-accel config`` (or given as the ``fsdp_config`` /
``deepspeed_config`` launcher options, or read from accelerate's own config file) reaches every rank as the
variables HF accelerate's launcher sets, so ``Accelerator()`` with no plugin shards — ours, and HF accelerate's
plugin reads the same settings. Real ranks (2 CPU processes, gloo) and the real ``notebook-accel`` command.
"""
from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator
from notebook_accel.errors import LaunchConfigError
from notebook_accel.plan.config import from_accelerate, load_config
from notebook_accel.plan.plan import plan_launch
from notebook_accel.plan.sharding import sharding_environment
from test_accelerator_distributed import launch
from test_cli import cli, home  # noqa: F401  (a fixture: a private HF_HOME with a script folder)

pytestmark = pytest.mark.timeout(300)
HAS_HF_ACCELERATE = importlib.util.find_spec("accelerate") is not None

SHARDED_SCRIPT = """
import os, warnings
warnings.simplefilter("ignore")
import torch
from notebook_accel import Accelerator
from notebook_accel.accelerator.fsdp import is_sharded
accelerator = Accelerator()  # no plugin: the launch's environment says FSDP
model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
blocks = sorted(name for name, module in model.named_modules() if is_sharded(module))
checkpointed = sum(type(module).__name__ == "CheckpointWrapper" for module in model.modules())
try:
    import accelerate
    plugin = accelerate.FullyShardedDataParallelPlugin()  # HF accelerate's, from the same variables
    hf = (plugin.fsdp_version, plugin.transformer_cls_names_to_wrap, plugin.activation_checkpointing)
except ImportError:
    hf = None
print(f"sharded={is_sharded(model)} blocks={blocks} checkpointed={checkpointed} hf={hf}")
"""


def test_a_saved_fsdp_default_shards_accelerator_in_every_rank(home):
    (home / "sharded.py").write_text(SHARDED_SCRIPT)
    saved = cli(home, "config", "default", "--use_fsdp", "--fsdp_transformer_layer_cls_to_wrap", "Linear",
                "--fsdp_activation_checkpointing", "true")
    assert saved.returncode == 0, saved.stderr
    path = home / "hf" / "notebook_accel" / "default_config.yaml"
    assert yaml.safe_load(path.read_text())["fsdp_config"] == {
        "fsdp_transformer_layer_cls_to_wrap": "Linear", "fsdp_activation_checkpointing": True}
    done = cli(home, "launch", "--num-processes", "2", "sharded.py")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if "sharded=" in line)
    hf = "(2, ['Linear'], True)" if HAS_HF_ACCELERATE else "None"
    # both Linear blocks by class name (wrapped for activation checkpointing), then the root
    expected = (f"sharded=True blocks=['', '0._checkpoint_wrapped_module', '2._checkpoint_wrapped_module'] "
                f"checkpointed=2 hf={hf}")
    assert lines == [f"[rank 0] {expected}", f"[rank 1] {expected}"]
    # the command line's sharding flags win over the saved default, as every other option's do
    plain = cli(home, "launch", "--num-processes", "2", "--use_deepspeed", "--zero_stage", "1",
                "--use_fsdp", "sharded.py")
    assert plain.returncode == 2 and "both shard the model: give one" in plain.stderr


def zero_from_the_launch() -> dict:
    warnings.simplefilter("ignore")
    accelerator = Accelerator()  # no plugin: the launch's environment says DeepSpeed
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    model, optimizer, _ = accelerator.prepare(model, optimizer, data)
    result = {"engine": type(model).__name__, "stage": model.zero_optimization_stage(),
              "clipping": model.gradient_clipping(), "accumulation": accelerator.gradient_accumulation_steps}
    if HAS_HF_ACCELERATE:
        from accelerate.utils import DeepSpeedPlugin as HFDeepSpeedPlugin

        plugin = HFDeepSpeedPlugin()  # HF accelerate's, from the same variables
        result["hf"] = (plugin.zero_stage, plugin.deepspeed_config["gradient_clipping"])
    return result


def test_a_deepspeed_default_in_the_config_file_builds_the_engine_in_every_rank(tmp_path):
    pytest.importorskip("deepspeed")
    config = tmp_path / "zero.yaml"
    config.write_text("deepspeed_config:\n  zero_stage: 3\n  gradient_clipping: 0.5\n"
                      "  gradient_accumulation_steps: 2\n")
    ranks = launch(zero_from_the_launch, config=str(config))  # notebook_launcher(..., config=path)
    expected = {"engine": "DeepSpeedEngine", "stage": 3, "clipping": 0.5, "accumulation": 2}
    if HAS_HF_ACCELERATE:
        expected["hf"] = (3, 0.5)
    assert ranks == [expected, expected]
    # the same as a launcher option, without a file
    assert launch(zero_from_the_launch, deepspeed_config={"zero_stage": 1})[1]["stage"] == 1


def test_accelerates_own_fsdp_and_deepspeed_sections_are_read():
    config = from_accelerate({"distributed_type": "FSDP", "num_processes": 2, "use_cpu": True, "fsdp_config": {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer", "fsdp_state_dict_type": "SHARDED_STATE_DICT"}})
    assert config.device == "cpu" and config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"
    zero = from_accelerate({"distributed_type": "DEEPSPEED", "num_processes": 2, "deepspeed_config": {
        "zero_stage": 2, "offload_optimizer_device": "cpu", "deepspeed_multinode_launcher": "standard"}})
    # what only accelerate's own launcher uses is left out
    assert zero.deepspeed_config == {"zero_stage": 2, "offload_optimizer_device": "cpu"}
    env = sharding_environment(None, zero.deepspeed_config)
    assert env == {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
                   "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
                   "ACCELERATE_CONFIG_DS_FIELDS": "zero_stage,offload_optimizer_device"}


def test_the_variables_are_accelerate_launchers(tmp_path, monkeypatch):
    ds_json = tmp_path / "ds.json"
    ds_json.write_text("{}")
    env = sharding_environment({"transformer_layer_cls_to_wrap": ["GPT2Block", "GPT2MLP"],
                                "fsdp_reshard_after_forward": False, "fsdp_offload_params": "true"}, None)
    assert env == {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
                   "FSDP_TRANSFORMER_CLS_TO_WRAP": "GPT2Block,GPT2MLP", "FSDP_RESHARD_AFTER_FORWARD": "false",
                   "FSDP_OFFLOAD_PARAMS": "true", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}
    assert sharding_environment({"fsdp_min_num_params": 1000}, None)["FSDP_AUTO_WRAP_POLICY"] == "SIZE_BASED_WRAP"
    monkeypatch.chdir(tmp_path)  # a relative config file becomes absolute: the ranks may start elsewhere
    zero = sharding_environment(None, {"deepspeed_config_file": "ds.json"})
    assert zero["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(ds_json)
    plan = plan_launch(print, num_processes=1, device="cpu", fsdp_config={"fsdp_min_num_params": 10})
    rank_env = plan.rank_env(0, {})
    assert rank_env["ACCELERATE_USE_FSDP"] == "true" and rank_env["FSDP_MIN_NUM_PARAMS"] == "10"
    assert "ACCELERATE_USE_FSDP" not in plan_launch(print, num_processes=1, device="cpu").rank_env(0, {})


@pytest.mark.parametrize("fsdp_config, deepspeed_config, message", [
    ({}, {}, "fsdp_config and deepspeed_config both shard the model: give one of them"),
    ({"fsdp_version": 1}, None, "FSDP2 (fully_shard) only"),
    ({"fsdp_transformer_layer_cls": "X"}, None, "unknown key 'fsdp_transformer_layer_cls'"),
    ({"fsdp_auto_wrap_policy": "EVERYTHING"}, None, "must be one of TRANSFORMER_BASED_WRAP"),
    (None, {"zero_stage": 4}, "must be 0, 1, 2 or 3"),
    (None, {"offload_param_device": "gpu"}, "must be one of none, cpu, nvme"),
    (None, {"deepspeed_config_file": "/nonexistent/ds.json"}, "does not exist"),
    (None, ["zero_stage"], "must be a mapping"),
])
def test_a_bad_sharding_default_is_refused_before_any_process_starts(fsdp_config, deepspeed_config, message):
    with pytest.raises(LaunchConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_launch(print, num_processes=2, device="cpu", fsdp_config=fsdp_config,
                    deepspeed_config=deepspeed_config)


def test_a_bad_saved_default_is_named_with_its_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("deepspeed_config:\n  zero_stage: 5\n")
    with pytest.raises(LaunchConfigError, match="bad.yaml: deepspeed_config.zero_stage must be 0, 1, 2 or 3"):
        load_config(str(path))


def test_sharding_on_tpu_cores_is_refused_before_torch_xla_is_looked_for():
    with pytest.raises(LaunchConfigError, match="fsdp_config with device='xla': FSDP2 and DeepSpeed shard over"):
        plan_launch(print, num_processes=1, device="xla", fsdp_config={})
