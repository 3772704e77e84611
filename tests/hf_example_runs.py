"""HF accelerate's example scripts (tests/hf_examples/, vendored unchanged) run as HF's own code in each rank of a
launch: on HF's accelerate, or on ours by the import alias of :mod:`hf_scripts`.

The scripts import ``transformers``, ``datasets`` and ``evaluate``, which are not installed (and the tests have no
network): ``tests/hf_examples/stand_ins/`` is put first on ``sys.path`` for these runs only. Each script's own
``main()`` runs with its own argument parser (:data:`EXAMPLES` gives the command line); its constants already make
a short run on the stand-ins' few dozen rows (3 epochs of 2 steps per rank). All scripts of one library run in one
launch, as HF's own tests run several trainings in one process.
"""
from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import re
import runpy
import sys
import traceback
from datetime import timedelta
from typing import Dict, Iterator, List, Optional

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_examples")

# script -> the command line its main() parses ("{workdir}": the launch's temp folder)
EXAMPLES: Dict[str, List[str]] = {
    "nlp_example.py": ["--cpu"],
    "checkpointing.py": ["--cpu", "--checkpointing_steps", "epoch", "--output_dir", "{workdir}"],
    "gradient_accumulation.py": ["--cpu", "--gradient_accumulation_steps", "2"],
    "early_stopping.py": ["--cpu"],
    "multi_process_metrics.py": ["--cpu"],
    "local_sgd.py": ["--cpu", "--local_sgd_steps", "2"],
    "memory.py": ["--cpu"],
    "tracking.py": ["--cpu", "--with_tracking", "--project_dir", "{workdir}/logs"],
    "cross_validation.py": ["--cpu", "--num_folds", "2"],
    "ddp_comm_hook.py": ["--cpu", "--ddp_comm_hook", "power_sgd"],
    "automatic_gradient_accumulation.py": ["--cpu"],
    "gradient_accumulation_for_autoregressive_models.py": ["--cpu", "--gradient_accumulation_steps", "2"],
    "profiler.py": ["--cpu", "--record_shapes", "--output_trace_dir", "{workdir}/trace"],
    "schedule_free.py": ["--cpu"],
}

# a short timeout: a rank left waiting on a failed one fails, not hangs
_TIMEOUT = timedelta(seconds=30)
# s: a script's turn (about 1 s quiet) that takes longer gets its rank's stacks in the rank's log
_SLOW = 20

# script -> environment its ranks need offline ("{workdir}" as above): log_with="all" finds W&B and MLflow installed;
# W&B would ask for a login, so it runs disabled (its calls still made); MLflow writes under the launch's folder
ENVIRONMENT: Dict[str, Dict[str, str]] = {
    "tracking.py": {"WANDB_MODE": "disabled", "WANDB_DIR": "{workdir}", "MLFLOW_TRACKING_URI": "file:{workdir}/mlruns",
                    "MLFLOW_ALLOW_FILE_STORE": "true"},
}


# a written file's name, normalised: the parts that change from run to run (a time, the host, a process id, a random
# run id) become "*", so that the two libraries' folders compare by name and layout only
_VARYING = [
    (re.compile(r"events\.out\.tfevents\..*"), "events.out.tfevents.*"),     # TensorBoard: time.host.pid.n
    (re.compile(r"(^|/)\d+\.\d+(?=/)"), r"\1*"),                               # TensorBoard hparams: a time
    (re.compile(r"(^|/)[0-9a-f]{32}(?=/|$)"), r"\1*"),                         # MLflow: run ids
    (re.compile(r"(^|/)\d{6,}(?=/|$)"), r"\1*"),                               # MLflow: experiment ids
    (re.compile(r"[^/]*\.pt\.trace\.json$"), "*.pt.trace.json"),              # profiler: host_pid.time.pt.trace.json
]


@contextlib.contextmanager
def _stacks_if_slow(log) -> Iterator[None]:
    """Every thread's stack written to ``log`` if the block takes over :data:`_SLOW` s (and the block goes on)."""
    faulthandler.dump_traceback_later(_SLOW, file=log)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _rank_log(folder: str) -> str:
    """This rank's log, beside the scripts' folders (:func:`rank_logs` reads them)."""
    return os.path.join(os.path.dirname(folder), f"rank{os.environ['RANK']}.log")


def rank_logs(workdir: str) -> str:
    """Every rank's log of a launch's scripts, one after the other: what each rank did, script by script, for a
    launch that fails between scripts, where only the first failing rank's error comes back."""
    logs = sorted(name for name in os.listdir(workdir) if name.startswith("rank") and name.endswith(".log"))
    return "\n".join(f"--- {name}:\n" + open(os.path.join(workdir, name)).read() for name in logs) or "(no rank logs)"


def written_files(folder: str) -> List[str]:
    """The files under ``folder`` (checkpoint folders' contents too), as sorted relative paths with
    :data:`_VARYING`'s parts replaced by "*"."""
    names = set()
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            for pattern, replacement in _VARYING:
                path = pattern.sub(replacement, path)
            names.add(path)
    return sorted(names)


def run_examples(library: str, scripts: List[str], workdir: str) -> Dict[str, Dict[str, object]]:
    """In each rank: HF's example ``scripts`` on ``library`` ("hf" or "ours"), one after the other in this one launch
    (HF's states reset between them, as HF's own tests do); ``{script: {"error": None when its main() returns, else
    the traceback, "printed": the lines it printed, "files": :func:`written_files` of its folder}}``. Each runs in its
    own folder under ``workdir``, with its :data:`ENVIRONMENT` for its time only. Each rank keeps a log of what it did
    (:func:`rank_logs`), with its threads' stacks if one script's turn takes over :data:`_SLOW` s."""
    import torch
    import torch.distributed as dist

    from hf_scripts import alias_accelerate_to_ours

    torch.set_num_threads(1)
    # as HF's notebook_launcher sets in its ranks: a script's end_training() keeps the group (on both libraries)
    os.environ["FORK_LAUNCHED"] = "1"
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=_TIMEOUT)
    if library == "ours":
        alias_accelerate_to_ours()
    sys.path.insert(0, os.path.join(HERE, "stand_ins"))
    return {script: _run_one(script, os.path.join(workdir, os.path.splitext(script)[0])) for script in scripts}


def _run_one(script: str, folder: str) -> Dict[str, object]:
    """One script's main() (its printed lines and written files kept), then HF's states reset for the next and the
    ranks met again (one may have failed)."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, GradientState  # HF's, or ours through the alias

    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    environment = dict(os.environ)
    os.environ.update({name: value.format(workdir=folder) for name, value in ENVIRONMENT.get(script, {}).items()})
    sys.argv = [script] + [argument.format(workdir=folder) for argument in EXAMPLES[script]]
    printed = io.StringIO()
    error: Optional[str] = None
    with open(_rank_log(folder), "a") as log, _stacks_if_slow(log):
        try:
            with contextlib.redirect_stdout(printed):
                runpy.run_path(os.path.join(HERE, script), run_name="__main__")
        except KeyboardInterrupt:  # a stop of the launch, or a SIGINT from elsewhere: said in the log, then raised
            log.write(f"{script}: interrupted (KeyboardInterrupt)\n{traceback.format_exc()}")
            raise
        except BaseException:  # noqa: B036  SystemExit from argparse too
            error = traceback.format_exc()
        finally:
            os.environ.clear()
            os.environ.update(environment)
            log.write(f"{script}: {'raised' if error else 'returned'}; the process group "
                      f"{'stays' if dist.is_initialized() else 'is gone'}\n{error or ''}")
            log.flush()
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
            dist.barrier()
    return {"error": error, "printed": printed.getvalue().splitlines(), "files": written_files(folder)}
