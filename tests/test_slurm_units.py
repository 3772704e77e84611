"""Slurm pieces that need no cluster: what the kernel asks Slurm to do, recorded (issue 45's small points)."""
from __future__ import annotations

import sys

from notebook_accel.backends.slurm import allocation


def test_a_job_salloc_never_named_is_cancelled_by_a_name_only_it_has(monkeypatch):
    # salloc died before printing "Pending/Granted job allocation N": release() can only cancel by name. The name
    # used to be notebook_accel:<function>, shared by every launch of that function by the user (two notebooks).
    asked = []
    monkeypatch.setattr(allocation, "run_tool", lambda argv, timeout: asked.append(argv))
    names = {allocation.allocation_name("notebook_accel:train") for _ in range(20)}
    assert len(names) == 20 and all(name.startswith("notebook_accel:train.") for name in names)
    name = names.pop()
    # a "salloc" that exits at once without a word; its argv carries the job name as salloc's would
    dead = allocation.Allocation([sys.executable, "-c", "import sys; sys.exit(1)", f"--job-name={name}"])
    dead.process.wait(30)
    dead.release()
    assert [argv[:3] for argv in asked] == [["scancel", "--quiet", f"--name={name}"]]
