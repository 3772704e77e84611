"""The ``notebook-accel`` command, run as users run it: a fresh ``python -m notebook_accel.cli`` process
launching real ranks, with its own Hugging Face cache folder so no user config is read."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import yaml

from scripts import script_env

SCRIPT = """
import os, sys
print(f"hello name={__name__} argv={sys.argv[1:]} rank={os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
      f"precision={os.environ['ACCELERATE_MIXED_PRECISION']}")
if "--exit" in sys.argv and os.environ["RANK"] == "1":
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
if "--raise" in sys.argv and os.environ["RANK"] == "1":
    raise ValueError("bad batch on rank 1")
sys.exit(0)   # a normal end
"""


@pytest.fixture
def home(tmp_path):
    """A private HF_HOME (our config and accelerate's live under it) and a folder with the script."""
    (tmp_path / "train.py").write_text(SCRIPT)
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(SCRIPT)
    return tmp_path


def cli(home, *argv: str, stdin: str = "", timeout: float = 180) -> subprocess.CompletedProcess:
    env = script_env()
    env["HF_HOME"] = str(home / "hf")
    env.pop("NOTEBOOK_ACCEL_CONFIG_FILE", None)
    return subprocess.run([sys.executable, "-m", "notebook_accel.cli", *argv], cwd=home, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def greetings(output: str):
    return sorted(line for line in output.splitlines() if " hello name=" in line)


def test_launch_script_runs_as_main_on_two_ranks_with_its_argv(home):
    done = cli(home, "launch", "--num-processes", "2", "--device", "cpu", "train.py", "--lr", "3")
    assert done.returncode == 0, done.stderr
    assert greetings(done.stdout) == [
        "[rank 0] hello name=__main__ argv=['--lr', '3'] rank=0 of 2 precision=no",
        "[rank 1] hello name=__main__ argv=['--lr', '3'] rank=1 of 2 precision=no",
    ]
    assert "python train.py --lr 3 · 2 × cpu · finished" in done.stdout


def test_exit_code_is_the_root_cause_ranks(home):
    exited = cli(home, "launch", "--num-processes", "2", "train.py", "--exit", "3")
    assert exited.returncode == 3, exited.stdout + exited.stderr
    assert "[rank 1] failed (root cause)" in exited.stdout
    raised = cli(home, "launch", "--num-processes", "2", "train.py", "--raise")
    assert raised.returncode == 1
    assert "ValueError: bad batch on rank 1" in raised.stderr
    assert "[rank 1]" in raised.stderr and 'train.py", line' in raised.stderr  # the rank's own traceback
    # ... starting at the script: the launcher's and runpy's frames are folded, in the rank and in the kernel
    frames = [line for line in raised.stderr.splitlines() if line.strip().startswith("File ")]
    assert frames and all("train.py" in frame for frame in frames), raised.stderr
    (home / "hang.py").write_text("import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(120)\n")
    timed_out = cli(home, "launch", "--num-processes", "2", "--timeout", "3", "hang.py")
    assert timed_out.returncode == 124, timed_out.stderr
    where = timed_out.stderr.split("Where they were:", 1)[1]
    assert 'hang.py", line 3 in <module>' in where and "launcher frames" in where and "folded" in where
    assert not [line for line in where.splitlines() if f"{os.sep}notebook_accel{os.sep}" in line]  # none of ours


def test_launch_module_with_dash_m(home):
    done = cli(home, "launch", "--num-processes", "2", "-m", "mypkg.job", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert greetings(done.stdout) == [
        "[rank 0] hello name=__main__ argv=['--epochs', '1'] rank=0 of 2 precision=no",
        "[rank 1] hello name=__main__ argv=['--epochs', '1'] rank=1 of 2 precision=no",
    ]


def test_launch_takes_its_defaults_from_the_config_file(home):
    done = cli(home, "config", "default", "--mixed-precision", "bf16")
    path = home / "hf" / "notebook_accel" / "default_config.yaml"
    assert done.returncode == 0 and str(path) in done.stdout
    saved = yaml.safe_load(path.read_text())
    assert saved["mixed_precision"] == "bf16" and saved["device"] == "cpu" and saved["num_processes"] == 1
    saved["num_processes"] = 2
    path.write_text(yaml.safe_dump(saved))
    done = cli(home, "launch", "train.py")
    assert done.returncode == 0, done.stderr
    assert len(greetings(done.stdout)) == 2 and "precision=bf16" in done.stdout
    overridden = cli(home, "launch", "--num-processes", "1", "--mixed-precision", "no", "train.py")
    assert greetings(overridden.stdout) == ["[rank 0] hello name=__main__ argv=[] rank=0 of 1 precision=no"]


def test_accelerate_spellings_and_accelerates_config_file(home):
    accelerate_config = home / "hf" / "accelerate" / "default_config.yaml"
    accelerate_config.parent.mkdir(parents=True)
    accelerate_config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "num_processes": 2,
        "num_machines": 1, "machine_rank": 0, "mixed_precision": "bf16", "use_cpu": True}))
    done = cli(home, "launch", "train.py")  # ours is absent: accelerate's file is read
    assert done.returncode == 0, done.stderr
    assert len(greetings(done.stdout)) == 2 and "precision=bf16" in done.stdout
    typed = cli(home, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--machine_rank", "0",
                "--mixed_precision", "no", "--main_process_port", "29555", "train.py")
    assert typed.returncode == 0, typed.stderr
    assert greetings(typed.stdout)[1] == "[rank 1] hello name=__main__ argv=[] rank=1 of 2 precision=no"


def test_bad_options_fail_before_any_process_starts(home):
    missing = cli(home, "launch", "nothere.py")
    assert missing.returncode == 2 and "script 'nothere.py' does not exist" in missing.stderr
    bad_module = cli(home, "launch", "-m", "no_such_module_here")
    assert bad_module.returncode == 2 and "no module named 'no_such_module_here'" in bad_module.stderr
    uneven = cli(home, "launch", "--num_processes", "3", "--num_machines", "2", "--rdzv-endpoint",
                 "127.0.0.1:1", "train.py")
    assert uneven.returncode == 2 and "does not divide evenly" in uneven.stderr
    no_endpoint = cli(home, "launch", "--num-nodes", "2", "train.py")
    assert no_endpoint.returncode == 2 and "needs rdzv_endpoint" in no_endpoint.stderr
    negative = cli(home, "launch", "--timeout", "-5", "train.py")  # checked by the table, as in a notebook
    assert negative.returncode == 2 and negative.stderr.strip().splitlines()[-1] == (
        "notebook-accel launch: timeout must be None or a positive number of seconds, got -5.0"), negative.stderr
    (home / "hf" / "notebook_accel").mkdir(parents=True)
    (home / "hf" / "notebook_accel" / "default_config.yaml").write_text("num_procs: 2\n")
    typo = cli(home, "launch", "train.py")
    assert typo.returncode == 2 and "unknown option(s) num_procs" in typo.stderr


def test_a_mistyped_option_or_a_missing_script_gets_launchs_own_usage_and_a_clear_message(home):
    typo = cli(home, "launch", "--num-procesess", "2", "train.py")
    assert typo.returncode == 2 and "hello" not in typo.stdout
    assert typo.stderr.startswith("usage: notebook-accel launch "), typo.stderr  # launch's usage, not the top's
    assert "unrecognized arguments: --num-procesess" in typo.stderr
    assert "did you mean --num-processes?" in typo.stderr, typo.stderr
    bad_choice = cli(home, "launch", "--device=cdu", "train.py")  # outside the choices: launch's usage too
    assert bad_choice.returncode == 2
    assert bad_choice.stderr.startswith("usage: notebook-accel launch "), bad_choice.stderr

    no_script = cli(home, "launch")
    assert no_script.returncode == 2
    assert no_script.stderr.startswith("usage: notebook-accel launch "), no_script.stderr
    message = no_script.stderr.strip().splitlines()[-1]
    assert message.startswith("notebook-accel launch: error: ") and "script.py" in message, message
    assert "target_args" not in no_script.stderr and "target" not in message.replace("script.py", ""), message

    config_typo = cli(home, "config", "--shwo")  # the same for every sub-command
    assert config_typo.returncode == 2 and config_typo.stderr.startswith("usage: notebook-accel config"), \
        config_typo.stderr


def test_config_questionnaire_and_write_basic_config(home):
    answers = "cpu\n2\nbf16\n2\n1\nc10d\nnode0.example:29400\n1\nfsdp\nGPT2Block\nyes\n"
    done = cli(home, "config", stdin=answers)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = yaml.safe_load((home / "hf" / "notebook_accel" / "default_config.yaml").read_text())
    assert saved == {"num_processes": 2, "device": "cpu", "mixed_precision": "bf16", "start_method": "auto",
                     "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                     "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
                                     "fsdp_activation_checkpointing": True},
                     "deepspeed_config": None, "num_nodes": 2, "node_rank": 1, "rdzv_backend": "c10d",
                     "rdzv_endpoint": "node0.example:29400", "rdzv_id": None, "max_restarts": 1}
    zero = cli(home, "config", "--config-file", str(home / "zero.yaml"), stdin="cpu\n1\n\n\n\ndeepspeed\n3\ncpu\n")
    assert zero.returncode == 0, zero.stdout + zero.stderr
    assert yaml.safe_load((home / "zero.yaml").read_text())["deepspeed_config"] == {
        "zero_stage": 3, "offload_optimizer_device": "cpu"}
    retry = cli(home, "config", stdin="gpu\ncpu\n0\n1\n\n\n\n")  # wrong answers are asked again
    assert "please answer one of: cpu" in retry.stdout and "please answer a whole number" in retry.stdout

    from notebook_accel.plan.config import load_config, write_basic_config

    target = home / "basic.yaml"
    assert write_basic_config("bf16", str(target)) == str(target)
    assert write_basic_config("no", str(target)) is False  # kept, as accelerate's does
    assert load_config(str(target)).mixed_precision == "bf16"


def test_env_and_self_test(home):
    env = cli(home, "env")
    assert env.returncode == 0
    for expected in ("notebook_accel:", "torch:", "start method:", "cpu:", "config file:    none"):
        assert expected in env.stdout
    test = cli(home, "test")
    assert test.returncode == 0, test.stdout + test.stderr
    assert test.stdout.strip().splitlines()[-1].startswith("PASS")
    assert "root-cause error: SelfTestError from rank 1" in test.stdout


def test_the_config_tools_refuse_what_every_launch_would_refuse(home):
    # This machine has no CUDA: a saved fp16 default would make every later launch exit 2.
    done = cli(home, "config", "default", "--mixed-precision", "fp16")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "mixed_precision='fp16' needs CUDA; on CPU use 'bf16'" in done.stderr and "nothing saved" in done.stderr
    assert not (home / "hf" / "notebook_accel" / "default_config.yaml").exists()
    (home / "fp16.yaml").write_text("device: cpu\nmixed_precision: fp16\n")  # written by hand: named on reading
    launch = cli(home, "launch", "--config-file", str(home / "fp16.yaml"), "train.py")
    assert launch.returncode == 2 and "fp16.yaml: mixed_precision='fp16' needs CUDA" in launch.stderr
    questionnaire = cli(home, "config", stdin="cpu\n1\nfp16\nbf16\n1\n0\n\n")  # fp16 is not offered on CPU
    assert questionnaire.returncode == 0 and "please answer one of: no, bf16" in questionnaire.stdout
    twice = cli(home, "config", "default")
    again = cli(home, "config", "default")
    assert twice.returncode == again.returncode == 0 and "add --overwrite" in again.stdout


def test_notebook_launcher_reads_the_config_only_when_asked(home):
    config = home / "mine.yaml"
    config.write_text("num_processes: 2\ndevice: cpu\nmixed_precision: bf16\n")
    code = f"""
        import os
        from notebook_accel import notebook_launcher
        def job():
            return os.environ["WORLD_SIZE"], os.environ["ACCELERATE_MIXED_PRECISION"]
        print(notebook_launcher(job, display="none", device="cpu"))
        print(notebook_launcher(job, display="none", config={str(config)!r}))
        print(notebook_launcher(job, display="none", config={str(config)!r}, num_processes=1))
        # what the user wrote wins over the file, also when it equals the launcher's default
        print(notebook_launcher(job, display="none", config={str(config)!r}, mixed_precision="no"))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=script_env(), capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == ["('1', 'no')", "('2', 'bf16')", "('1', 'bf16')", "('2', 'no')"]


def test_ctrl_c_stops_every_rank_and_exits_130(home):
    (home / "slow.py").write_text("import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(120)\n")
    env = script_env()
    env["HF_HOME"] = str(home / "hf")
    process = subprocess.Popen([sys.executable, "-m", "notebook_accel.cli", "launch", "--num-processes", "2",
                                "slow.py"], cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    seen = set()
    while len(seen) < 2:  # both ranks run
        line = process.stdout.readline()
        assert line, process.stderr.read()
        if line.startswith("[rank ") and " up " in line:
            seen.add(line.split()[1])
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted; every rank was stopped" in err


def test_max_restarts_reruns_the_script(home):
    (home / "flaky.py").write_text(textwrap.dedent("""
        import os, sys
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        print(f"attempt {attempt}", flush=True)
        if attempt == "0" and os.environ["RANK"] == "1":
            raise RuntimeError("flaky")
    """))
    done = cli(home, "launch", "--num-processes", "2", "--max-restarts", "1", "flaky.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[rank 1] attempt 1" in done.stdout and "attempt 2/2 · finished" in done.stdout


def test_env_report_values_start_in_one_column_and_devices_read_plainly():
    import re

    from notebook_accel.cli.env import environment_report
    from notebook_accel.plan import devices

    report = environment_report()
    columns = {len(found.group(0)) for line in report.splitlines()
               for found in [re.match(r"^[^\s:-][^:]*:\s+", line)] if found}
    assert len(columns) == 1, report  # e.g. "best device:" and "python:" values line up
    cpu = devices.describe("cpu")
    assert cpu.description == f"{cpu.count} CPU core{'s' if cpu.count != 1 else ''}"
    assert f"cpu ({cpu.description})" in report and "((" not in report and "))" not in report, report
