"""A real time limit on the real Slurm cluster (``slurm_cluster``, two nodes): a launch with ``slurm={"time": "1"}``
asks salloc for ``--signal=USR2@30``; Slurm warns the ranks before it ends the job; they agree on a step, the library
saves the checkpoint and the launch raises ``TimeLimitReached``. A second launch resumes it with ``load_state()`` and
ends with the weights of a third, never interrupted.

The "kernel" is a script run from the login node, as the launch tests of ``test_slurm_launch.py`` do.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

import slurm_cluster
from resumable_training import TRAIN
from scripts import script_env

pytestmark = [pytest.mark.skipif(slurm_cluster.unavailable() is not None, reason=slurm_cluster.unavailable() or ""),
              pytest.mark.timeout(600)]

KERNEL = TRAIN + textwrap.dedent('''
    import json, sys
    from notebook_accel import TimeLimitReached, notebook_launcher

    folder = sys.argv[1]
    options = dict(num_processes=2, num_nodes=2, cluster="slurm", display="none", timeout=240)
    report = {}
    try:
        # steps of 0.2 s until the warning: Slurm's signal comes 30-60 s into a job of one minute
        notebook_launcher(train, args=(folder + "/cut", 10**6, 0.2, False), slurm={"time": "1"}, **options)
        report["broken"] = "the launch ended without TimeLimitReached"
    except TimeLimitReached as error:
        report.update(step=error.step, checkpoint=error.checkpoint, message=str(error).splitlines()[0])
    if "step" in report:
        total = report["step"] + 5
        report["resumed"] = notebook_launcher(train, args=(folder + "/cut", total, 0.0, True), **options)
        report["whole"] = notebook_launcher(train, args=(folder + "/whole", total, 0.0, False), **options)
    print("REPORT " + json.dumps(report), flush=True)
''')


def test_a_job_warned_before_its_time_limit_checkpoints_raises_and_resumes_to_the_same_weights(slurm, tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    done = slurm.run([sys.executable, str(script), str(tmp_path)], env=dict(script_env(), SLURM_CONF=slurm.conf),
                     timeout=500)  # fmt: skip
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{slurm.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert "broken" not in report, f"{report}\n{done.stderr[-3000:]}"
    assert report["step"] > 0 and report["checkpoint"] == f"{tmp_path}/cut/checkpoints/checkpoint_0", report
    assert report["message"].startswith(f"time limit reached at step {report['step']}; checkpoint at "), report
    assert report["resumed"] == report["whole"], report
    assert slurm.wait_no_jobs(timeout=30) == []
