"""A real Slurm cluster for the tests: Debian's slurmctld, slurmd and munge, on real hosts (``real_hosts``).

The controller (``slurmctld``) runs here, on the host side of the bridge, as a login node does; each compute node is
one ``slurmd -D -N nK`` in a network namespace of its own, with its own address. munge authenticates every message
(one ``munged`` with a key made here, its socket in the cluster's directory). Nothing is installed or written outside
that directory: the configuration, the spool and state directories, the logs and munge's files all live there, so
clients find the cluster through ``SLURM_CONF`` (``env``), and two test runs never meet (their own ports, cluster
names and addresses).

The cluster is as small as Slurm allows: ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` (no
cgroups needed to track or bind tasks), no accounting, ``SlurmUser=root``. A slurmd in a network namespace still wants
the cgroup v1 hierarchies under ``/sys/fs/cgroup``, which ``ip netns exec`` hides when it remounts ``/sys``: they are
mounted again in the slurmd's own mount namespace (the one ``ip netns exec`` made) before it starts.

``close`` ends every process it started by its process group (slurmctld, each slurmd with the slurmstepd's it made,
munged), cancels nothing by name, and removes the directory; ``RealHosts.close`` then kills whatever still runs in
the namespaces and deletes them.

Example::

    with RealHosts(2) as hosts, SlurmCluster(hosts) as cluster:
        print(cluster.run(["srun", "-N2", "-n4", "hostname"]).stdout)
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import psutil

import real_hosts
from real_hosts import RealHosts, _end_group

COMMANDS = ("slurmctld", "slurmd", "srun", "sbatch", "salloc", "squeue", "scancel", "sinfo", "scontrol", "munged")
CGROUPS_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")
START_WAIT = 60.0      # s the nodes may take to register with the controller (a loaded 2-core machine)
PARTITION = "debug"
MAX_TIME = "00:30:00"  # the partition's time limit: a test's job asking for more is refused


def unavailable() -> Optional[str]:
    """Why a Slurm cluster cannot be made here (for ``pytest.skip``), or None."""
    from real_hosts import unavailable as no_hosts

    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        return (f"a Slurm cluster needs {', '.join(missing)} (apt-get install -y slurmctld slurmd slurm-client "
                f"munge)")
    return no_hosts()


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


class SlurmCluster:
    """A controller here and one slurmd per host of ``hosts`` (see the module docstring); ``cpus`` per node."""

    _made = 0

    def __init__(self, hosts: RealHosts, cpus: int = 2, gpus: int = 0) -> None:
        self.hosts = hosts
        self.cpus = cpus
        self.gpus = gpus
        # Short, in /tmp itself: slurmstepd's Unix sockets live in the spool directory, named after the node, job and
        # step (a batch step's id has 10 digits), and a socket's path may not exceed 107 bytes. The suite's temp dir
        # is too deep for that ("slurmstepd failed to send return code": the batch job never ran).
        self.directory = tempfile.mkdtemp(prefix="na-slurm-", dir="/tmp")
        os.chmod(self.directory, 0o700)
        SlurmCluster._made += 1   # unique names per run: the pid, the hosts' slice, and a count of this process's
        self.name = f"na{os.getpid() % 100000}s{hosts.slice}c{SlurmCluster._made}"
        self.nodes = [f"{self.name}n{index}" for index in range(hosts.count)]
        self._processes: List[subprocess.Popen] = []
        self._logs: List = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ paths

    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    @property
    def conf(self) -> str:
        return self.path("slurm.conf")

    @property
    def env(self) -> Dict[str, str]:
        """The environment a client (srun, sbatch, our launcher) uses to reach this cluster."""
        env = dict(os.environ, SLURM_CONF=self.conf)
        for name in [name for name in env if name.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))]:
            if name != "SLURM_CONF":
                del env[name]
        return env

    # ------------------------------------------------------------------------------------------------ start

    def _start(self) -> None:
        for name in ("state", "log"):
            os.makedirs(self.path(name))
        for node in self.nodes:
            os.makedirs(self.path("spool", node))
        self._start_munge()
        controller_port = _free_port(self.hosts.outside_address)
        slurmd_port = _free_port(self.hosts.outside_address)  # free in each namespace too: they start empty
        self._write_conf(controller_port, slurmd_port)
        self._started(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld")
        for index, node in enumerate(self.nodes):
            mounts = " && ".join(f"mkdir -p /sys/fs/cgroup/{name} && mount -t cgroup -o {name} cgroup "
                                 f"/sys/fs/cgroup/{name}" for name in CGROUPS_V1)
            script = (f"mount -t tmpfs cgroup_root /sys/fs/cgroup && {mounts} && "
                      f"exec slurmd -D -N {node} -f {self.conf}")
            log = open(self.path("log", f"{node}.out"), "wb")
            self._logs.append(log)
            self._processes.append(self.hosts.start(index, ["sh", "-c", script], env=self.env, keep=True,
                                                    stdout=log, stderr=subprocess.STDOUT))
        self._wait_idle()

    def _start_munge(self) -> None:
        key = self.path("munge.key")
        with open(key, "wb") as out:
            out.write(os.urandom(128))
        os.chmod(key, 0o400)
        self._started(["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                       f"--pid-file={self.path('munged.pid')}", f"--seed-file={self.path('munged.seed')}",
                       f"--log-file={self.path('log', 'munged.log')}"], "munged")
        deadline = time.monotonic() + 20
        while not os.path.exists(self.munge_socket):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not make its socket: {self.log('munged.out')}")
            time.sleep(0.05)

    @property
    def munge_socket(self) -> str:
        return self.path("munge.socket")

    def _started(self, argv: Sequence[str], name: str) -> subprocess.Popen:
        log = open(self.path("log", f"{name}.out"), "wb")
        self._logs.append(log)
        process = subprocess.Popen(list(argv), env=self.env, start_new_session=True, stdout=log,
                                   stderr=subprocess.STDOUT)
        self._processes.append(process)
        real_hosts.KEPT_TREES.add(process.pid)   # up for the module's tests: the per-test leftover check skips it
        return process

    def _write_conf(self, controller_port: int, slurmd_port: int) -> None:
        hostname = socket.gethostname()
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={hostname}({self.hosts.outside_address})",
            f"SlurmctldPort={controller_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool', '%n')}",
            f"SlurmctldPidFile={self.path('slurmctld.pid')}",
            f"SlurmdPidFile={self.path('spool', '%n', 'slurmd.pid')}",
            f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}",
            f"SlurmdLogFile={self.path('log', 'slurmd-%n.log')}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "LaunchParameters=use_interactive_step",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=2",
            "KillWait=2",
            "Waittime=0",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        if self.gpus:
            lines.append("GresTypes=gpu")
            self._write_gres()
        for node, address in zip(self.nodes, self.hosts.addresses):
            gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
            lines.append(f"NodeName={node} NodeAddr={address} NodeHostname={node} CPUs={self.cpus} "
                         f"RealMemory=1000{gres} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES MaxTime={MAX_TIME} "
                     f"State=UP")
        with open(self.conf, "w") as out:
            out.write("\n".join(lines) + "\n")
        with open(self.path("cgroup.conf"), "w") as out:   # read by slurmd even with no cgroup plugin in use
            out.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _write_gres(self) -> None:
        """``gpus`` stand-in GPUs per node, for Slurm's GPU binding (there is no GPU here): gres.conf's ``File`` of
        each is a character device of the cluster's directory — /dev/null's numbers, so nothing can reach hardware
        through it. Slurm only needs the file to be a device: it then binds GPUs to steps and tasks as on a real
        cluster (``CUDA_VISIBLE_DEVICES``, ``SLURM_GPUS_ON_NODE``); a regular file gets no binding at all."""
        null = os.stat("/dev/null").st_rdev
        with open(self.path("gres.conf"), "w") as out:
            for node in self.nodes:
                for index in range(self.gpus):
                    os.mknod(self.path(f"{node}-gpu{index}"), 0o600 | stat.S_IFCHR, null)
                out.write(f"NodeName={node} Name=gpu File={self.path(node + '-gpu')}[0-{self.gpus - 1}]\n")

    def _wait_idle(self) -> None:
        """Until every node says it is idle (registered with the controller)."""
        deadline = time.monotonic() + START_WAIT
        states = ""
        while time.monotonic() < deadline:
            self._check_alive()
            listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True,
                                    text=True, timeout=30)
            states = listed.stdout + listed.stderr
            lines = [line.split() for line in listed.stdout.splitlines() if line.strip()]
            if listed.returncode == 0 and len(lines) == len(self.nodes) and all(state == "idle" for _, state in lines):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not come up within {START_WAIT:.0f} s: {states}\n{self.logs()}")

    def _check_alive(self) -> None:
        for process in self._processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} ended with {process.returncode}:\n{self.logs()}")

    # ------------------------------------------------------------------------------------------------ use

    def run(self, argv: Sequence[str], timeout: float = 120, env: Optional[Dict[str, str]] = None,
            **options) -> subprocess.CompletedProcess:
        """A client command (``srun``, ``sbatch``, ``squeue``...) from the login node (here), as text."""
        return subprocess.run(list(argv), env=env or self.env, capture_output=True, text=True, timeout=timeout,
                              **options)

    def jobs(self) -> List[str]:
        """The jobs in the queue now (``squeue``: "id name state"), this cluster's only."""
        listed = self.run(["squeue", "-h", "-o", "%i %j %T"])
        return [line for line in listed.stdout.splitlines() if line.strip()]

    def steps(self) -> List[str]:
        """The job steps running now (``squeue -s``: "jobid.stepid name"), the batch and external steps left out."""
        listed = self.run(["squeue", "-h", "-s", "-o", "%i %j"])
        return [line for line in listed.stdout.splitlines()
                if line.strip() and not line.split()[0].endswith((".batch", ".extern", ".interactive"))]

    def wait_no_jobs(self, timeout: float = 30.0) -> List[str]:
        """Wait until no job is left in the queue; the jobs still there after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.jobs()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def log(self, name: str) -> str:
        try:
            with open(self.path("log", name), errors="replace") as text:
                return text.read()[-4000:]
        except OSError:
            return ""

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure's message."""
        return "\n".join(f"--- {name}\n{self.log(name)}" for name in sorted(os.listdir(self.path("log"))))

    def slurmstepds(self) -> List[int]:
        """The pids of the slurmstepd processes running now under this cluster's slurmd's."""
        found = []
        for process in self._processes:
            try:
                for child in psutil.Process(process.pid).children(recursive=True):
                    if "slurmstepd" in child.name():
                        found.append(child.pid)
            except psutil.Error:
                pass
        return found

    # ------------------------------------------------------------------------------------------------ end

    def close(self) -> None:
        """Cancel every job and wait until the nodes ended their steps (slurmstepd's leave slurmd's process group:
        only slurmd ends them), then end every daemon by its process group, and remove the directory (idempotent).
        What still runs in the namespaces after that is ``RealHosts.close``'s to kill."""
        if self._processes and os.path.exists(self.conf):
            try:
                self.run(["scancel", "--full", "--quiet", "-u", "root"], timeout=10)
                self.wait_no_jobs(timeout=15)
            except (subprocess.SubprocessError, OSError):
                pass
        # The nodes first (their slurmstepd's are in their groups: SIGTERM makes slurmd end its steps), munged last.
        for process in reversed(self._processes):
            _end_group(process, grace=5.0)
            _reap(process)
            real_hosts.KEPT_TREES.discard(process.pid)
        self._processes = []
        for log in self._logs:
            log.close()
        self._logs = []
        shutil.rmtree(self.directory, ignore_errors=True)


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(5)
