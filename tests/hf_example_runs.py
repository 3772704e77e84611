"""HF accelerate's example scripts (tests/hf_examples/, vendored unchanged) run as HF's own code in each rank of a
launch: on HF's accelerate, or on ours by the import alias of :mod:`hf_scripts`.

The scripts import ``transformers``, ``datasets`` and ``evaluate``, which are not installed (and the tests have no
network): ``tests/hf_examples/stand_ins/`` is put first on ``sys.path`` for these runs only. Each script's own
``main()`` runs with its own argument parser (:data:`EXAMPLES` gives the command line); its constants already make
a short run on the stand-ins' few dozen rows (3 epochs of 2 steps per rank).
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from datetime import timedelta
from typing import Dict, List, Optional

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

# script -> environment its ranks need offline ("{workdir}" as above): log_with="all" finds W&B and MLflow installed;
# W&B would ask for a login, so it runs disabled (its calls still made); MLflow writes under the launch's folder
ENVIRONMENT: Dict[str, Dict[str, str]] = {
    "tracking.py": {"WANDB_MODE": "disabled", "WANDB_DIR": "{workdir}", "MLFLOW_TRACKING_URI": "file:{workdir}/mlruns",
                    "MLFLOW_ALLOW_FILE_STORE": "true"},
}


def run_example(library: str, script: str, workdir: str) -> Optional[str]:
    """In each rank: HF's example ``script`` on ``library`` ("hf" or "ours"); None when its main() returns, else the
    traceback."""
    import torch
    import torch.distributed as dist

    from hf_scripts import alias_accelerate_to_ours

    torch.set_num_threads(1)
    os.chdir(workdir)
    os.environ.update({name: value.format(workdir=workdir) for name, value in ENVIRONMENT.get(script, {}).items()})
    if not dist.is_initialized():  # a short timeout: a rank left waiting on a failed one fails, not hangs
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    if library == "ours":
        alias_accelerate_to_ours()
    sys.path.insert(0, os.path.join(HERE, "stand_ins"))
    sys.argv = [script] + [argument.format(workdir=workdir) for argument in EXAMPLES[script]]
    try:
        runpy.run_path(os.path.join(HERE, script), run_name="__main__")
        return None
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: B036  SystemExit from argparse too
        return traceback.format_exc()
