"""``cluster="slurm"`` beyond one launch, on a real Slurm cluster (``slurm_cluster``): a warm ``Session`` in a job of
its own (asked for, waited for, given back at ``close()``, at the kernel's exit, and on Ctrl-C while it pends), and
pdb in a rank on another node, for a launch and for a session; and GPUs as Slurm binds them (the nodes declare two
stand-in GPUs each: ``SlurmCluster(gpus=2)``), which is where Slurm and torchrun's ``cuda:LOCAL_RANK`` can disagree.

Each "kernel" is a script run from the login node (here, outside the namespaces), as a notebook on a login node runs;
the pdb one under ``salloc -N2``, as a batchspawner notebook runs inside its job.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

import pdb_dialogue
import slurm_cluster
from scripts import script_env

pytestmark = [pytest.mark.skipif(slurm_cluster.unavailable() is not None, reason=slurm_cluster.unavailable() or ""),
              pytest.mark.timeout(600)]


@pytest.fixture
def cluster(slurm):
    """The run's one Slurm cluster (``shared_clusters.slurm``: two stand-in GPUs per node, Slurm's binding, no CUDA)."""
    return slurm


OWN_JOB = textwrap.dedent('''
    import json, os, signal, subprocess, sys, threading, time
    from notebook_accel import Session

    BLOCKER = sys.argv[1]

    def ours():   # our jobs that wait for or hold nodes; one given back may still be COMPLETING a moment
        listed = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout
        return [line for line in listed.splitlines()
                if "notebook_accel" in line and line.endswith(("PENDING", "CONFIGURING", "RUNNING"))]

    def where():
        import torch, torch.distributed as dist
        total = torch.tensor([1.0])
        dist.all_reduce(total)
        return {"node": os.environ["SLURMD_NODENAME"], "job": os.environ["SLURM_JOB_ID"], "sum": total.item()}

    def raise_on_rank_1():
        if os.environ["RANK"] == "1":
            raise ValueError("rank 1 found a bad batch")

    class Watched:   # the cell's stderr as its reader sees it
        def __init__(self, stream):
            self.stream, self.text = stream, ""
        def write(self, text):
            self.text += text
            return self.stream.write(text)
        def __getattr__(self, name):
            return getattr(self.stream, name)

    sys.stderr = Watched(sys.stderr)

    def interrupt_once_pending():   # Jupyter's interrupt is a SIGINT to the kernel
        # as a person does: once the session said its job pends (not as soon as squeue lists it: under load, the
        # interrupt then came before the session had read salloc's job id and asked squeue for the reason)
        deadline = time.monotonic() + 120
        while "pending in the queue (" not in sys.stderr.text or not any(line.endswith("PENDING") for line in ours()):
            if time.monotonic() > deadline:   # interrupted anyway: the test's check of stderr says what is missing
                break
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    report = {}
    threading.Thread(target=interrupt_once_pending, daemon=True).start()
    try:   # a job of BLOCKER's holds every CPU: the session's own pends behind it
        Session(num_processes=2, num_nodes=2, cluster="slurm", display="text", slurm={"time": "00:05:00"})
    except KeyboardInterrupt:
        report["interrupted"] = True
    report["after_interrupt"] = ours()
    subprocess.run(["scancel", BLOCKER], check=True)

    with Session(num_processes=2, num_nodes=2, cluster="slurm", display="text", slurm={"time": "00:05:00"}) as session:
        report["open"] = ours()
        report["ranks"] = session.run(where, return_all=True)
        try:   # a failing run names the node its root cause ran on, as a launch does (issue 45)
            session.run(raise_on_rank_1)
        except ValueError as error:
            report["failed_on"] = [getattr(error, "node", None), [note for note in error.__notes__ if "ran on" in note]]
    report["after_close"] = ours()

    left_open = Session(num_processes=2, num_nodes=2, cluster="slurm", display="none", slurm={"time": "00:05:00"})
    report["left_open"] = left_open.run(where, return_all=True)
    print("REPORT " + json.dumps(report), flush=True)
    # no close(): the kernel's exit gives the job back
''')


def test_a_session_asks_for_its_own_job_and_gives_it_back_on_ctrl_c_close_and_exit(cluster, tmp_path):
    """Outside an allocation, ``Session(num_nodes=2, cluster="slurm", slurm={...})`` asks Slurm for a two-node job.
    Interrupted while that job pends, it withdraws it; opened, it runs on both nodes of one job named after it;
    ``close()`` gives the job back, and so does the kernel's exit for a session never closed."""
    blocker = cluster.run(["sbatch", "--parsable", "-N2", "-n4", "-o", "/dev/null", "--wrap", "sleep 300"])
    assert blocker.returncode == 0, blocker.stderr
    script = tmp_path / "own_job.py"
    script.write_text(OWN_JOB)
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    done = cluster.run([sys.executable, str(script), blocker.stdout.strip()], env=env, timeout=500)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{cluster.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert report.get("interrupted") and report["after_interrupt"] == []
    assert "pending in the queue (" in done.stderr and "interrupting the kernel (Ctrl-C) ends the wait" in done.stderr
    assert len(report["open"]) == 1 and report["open"][0].split()[2] == "RUNNING"
    assert report["open"][0].split()[1].startswith("notebook_accel:session.")  # a tag of its own (allocation_name)
    job = report["open"][0].split()[0]
    assert [(rank["node"], rank["job"], rank["sum"]) for rank in report["ranks"]] == [
        (cluster.nodes[0], job, 2.0), (cluster.nodes[1], job, 2.0)]
    assert report["failed_on"] == [cluster.nodes[1], [f"(notebook_accel: rank 1 ran on node {cluster.nodes[1]})"]]
    assert report["after_close"] == []
    assert [rank["node"] for rank in report["left_open"]] == cluster.nodes
    assert cluster.wait_no_jobs() == [], cluster.jobs()


PDB = pdb_dialogue.kernel_script("", launch='num_processes=2, cluster="slurm"',
                                 session='num_processes=2, cluster="slurm"')


def test_pdb_in_a_rank_on_another_node_for_a_launch_and_a_session(cluster, tmp_path):
    """Inside ``salloc -N2``: rank 1 (on the second node) stops at ``breakpoint()``; pdb's lines come back labelled,
    what is typed in the terminal reaches the task through srun's stdin and changes its frame (x comes back as 100);
    a failed Session run's ``Session.debug()`` and a launch's ``pdb=True`` post-mortem open in the failing frame."""
    import pexpect

    script = tmp_path / "pdb_kernel.py"
    script.write_text(PDB)
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    child = pexpect.spawn("salloc", ["-N2", sys.executable, str(script)], env=env, cwd=str(tmp_path),
                          encoding="utf-8", timeout=180, dimensions=(40, 200))
    try:
        pdb_dialogue.talk_to_rank_1(child)
    finally:
        child.close(force=True)
    assert cluster.wait_no_jobs() == [], cluster.jobs()


GPUS = textwrap.dedent('''
    import json, os, sys
    from notebook_accel import notebook_launcher
    from notebook_accel.plan.plan import plan_launch

    def where():
        return {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "SLURMD_NODENAME",
                                                       "CUDA_VISIBLE_DEVICES")}

    report = {}
    if os.environ.get("SLURM_JOB_ID"):   # inside salloc --gpus-per-task=1
        report["device"] = plan_launch(where, num_processes=4, num_nodes=2, cluster="slurm").device
        report["ranks"] = notebook_launcher(where, num_processes=4, num_nodes=2, cluster="slurm", display="none",
                                            return_all=True)
    else:                                # from the login node: the launch asks for the GPUs
        report["device"] = plan_launch(where, num_nodes=2, cluster="slurm", slurm={"gpus-per-node": 2}).device
        report["ranks"] = notebook_launcher(where, num_processes=4, num_nodes=2, cluster="slurm", device="cuda",
                                            display="none", return_all=True, slurm={"time": "00:05:00"})
        report["defaulted"] = notebook_launcher(where, num_nodes=2, cluster="slurm", display="none",
                                                return_all=True, slurm={"gpus-per-node": 2, "time": "00:05:00"})
    print("REPORT " + json.dumps(report), flush=True)
''')


def _every_rank_sees_its_nodes_gpus(ranks, nodes):
    """torchrun's rule on a GPU node: every rank sees the node's GPUs, and ``cuda:LOCAL_RANK`` is its own."""
    assert [(rank["RANK"], rank["LOCAL_RANK"], rank["SLURMD_NODENAME"]) for rank in ranks] == [
        ("0", "0", nodes[0]), ("1", "1", nodes[0]), ("2", "0", nodes[1]), ("3", "1", nodes[1])]
    assert [rank["CUDA_VISIBLE_DEVICES"] for rank in ranks] == ["0,1"] * 4


@pytest.mark.parametrize("where", ["inside a job that binds one GPU per task", "outside a job"])
def test_gpus_as_slurm_binds_them_every_rank_sees_its_nodes_gpus(cluster, tmp_path, where):
    """Inside ``salloc --gpus-per-task=1`` (whose binding srun would inherit: each rank would see one GPU, as index
    0, and ``cuda:1`` would be no device) the step asks for the node's GPUs instead; outside a job, the launch asks
    for one GPU per rank (without that, srun refuses the step: the job has no GPUs). A job with GPUs makes "cuda"
    the default device, and one rank per GPU the default count."""
    script = tmp_path / "gpus.py"
    script.write_text(GPUS)
    env = dict(script_env(), SLURM_CONF=cluster.conf)
    inside = where.startswith("inside")
    argv = ["salloc", "-N2", "-n4", "--gpus-per-task=1"] if inside else []
    done = cluster.run(argv + [sys.executable, str(script)], env=env, timeout=300)
    reports = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and reports, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{cluster.logs()}"
    report = json.loads(reports[0][len("REPORT "):])
    assert report["device"] == "cuda"
    _every_rank_sees_its_nodes_gpus(report["ranks"], cluster.nodes)
    if not inside:
        _every_rank_sees_its_nodes_gpus(report["defaulted"], cluster.nodes)
    assert cluster.wait_no_jobs() == [], cluster.jobs()
