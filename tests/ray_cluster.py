"""A fake multi-node Ray cluster for the tests: ``ray.cluster_utils.Cluster``, one per test module.

Its processes (GCS, one raylet per "node", their workers) are children of the test process. They stay up for the
module's tests, so the suite's leftover check (``conftest.no_leftovers``) is told to leave their trees alone
(``KEPT_TREES``, which conftest looks up here); ``shutdown`` ends them — ``ray.shutdown()`` and ``Cluster.shutdown()``, never ``ray stop``,
which would end every Ray process of the machine — and fails if any of them is still there. Ray writes its session
files under ``RAY_TMPDIR`` and, since 2.60, an auth token under ``~/.ray``: both point into a temp dir of the fixture's
own while the cluster is up.

``leftovers()`` is what each test checks after it ran: no rank actor's process and no placement group remain.
"""
from __future__ import annotations

import builtins
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List

import psutil


FAST_IMPORTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_fast_imports")
CLIENT_SERVER = "ray.util.client.server"  # the module Ray's client server (ray://) runs as
ACTOR_TITLE = "ray::RankActor"   # the process title Ray gives our actors' workers
# The pids at the top of the process trees a module's fake cluster keeps up (its GCS, raylets, their workers): the
# suite's leftover check leaves them alone until ``FakeCluster.shutdown`` ends them and checks they ended.
KEPT_TREES: set = set()


class FakeCluster:
    """A head node and more nodes, each a raylet of its own on this machine.

    >>> cluster = FakeCluster([{"num_cpus": 2}, {"num_cpus": 2}])   # doctest: +SKIP
    >>> ...; cluster.shutdown()                                      # doctest: +SKIP
    """

    def __init__(self, nodes: List[Dict[str, Any]]) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.ray = ray
        # Short: Ray's Unix sockets live under it, and their paths may not exceed 107 bytes (the suite's temp dir is
        # too deep for that). Removed by ``shutdown``.
        self.temp = tempfile.mkdtemp(prefix="na-ray-", dir="/tmp")
        self._saved = {name: os.environ.get(name) for name in ("RAY_TMPDIR", "HOME", "PYTHONPATH")}
        # Ray's driver replaces builtins.print (tqdm_ray's safe_print) once a worker's bar reaches it, and never puts
        # it back: later tests of this process would launch Ray's print (test_panel saw "LaunchPanel(safe_print").
        self._print = builtins.print
        os.environ["RAY_TMPDIR"] = self.temp
        os.environ["HOME"] = self.temp
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [FAST_IMPORTS, self._saved["PYTHONPATH"]]))
        self._before = {child.pid for child in psutil.Process().children()}
        try:
            head, *others = nodes
            self.cluster = Cluster(initialize_head=True, head_node_args=dict(include_dashboard=False, **head))
            self.nodes = [self.cluster.head_node] + [self.cluster.add_node(**node) for node in others]
            self.cluster.wait_for_nodes()
            self._keep_new_children()
            ray.init(address=self.cluster.address)
        except BaseException:
            self.shutdown()
            raise

    def _keep_new_children(self) -> None:
        """The new children that are the cluster's: each of Ray's processes names the cluster's temp dir, but for the
        head's Ray Client server (``ray_client_server_port``), named by its module. Not what an earlier test of the
        module started meanwhile (a fork server, its resource tracker), which outlive the cluster by design."""
        KEPT_TREES.update(child.pid for child in psutil.Process().children()
                          if child.pid not in self._before and any(mark in command_line(child)
                                                                   for mark in (self.temp, CLIENT_SERVER)))

    def add_node(self, **resources: Any) -> Any:
        node = self.cluster.add_node(**resources)
        self.cluster.wait_for_nodes()
        self._keep_new_children()
        self.nodes.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node)
        self.nodes.remove(node)

    def node_ids(self) -> List[str]:
        return [node["NodeID"] for node in self.ray.nodes() if node["Alive"]]

    def shutdown(self) -> None:
        """End the cluster and everything it started; fail if any of its processes outlives that."""
        kept = [psutil.Process(pid) for pid in KEPT_TREES if psutil.pid_exists(pid)]
        tree = kept + [child for process in kept for child in _children(process)]
        try:
            self.ray.shutdown()
            if getattr(self, "cluster", None) is not None:
                self.cluster.shutdown()
            _, alive = psutil.wait_procs(tree, timeout=30)
            named = [f"{process.pid} {command_line(process)[:300]}" for process in alive]
            for process in alive:
                process.kill()
            assert not alive, f"Ray processes outlived the cluster's shutdown: {named}"
        finally:
            builtins.print = self._print
            KEPT_TREES.clear()
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(self.temp, ignore_errors=True)


def _children(process: psutil.Process) -> List[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def rank_actor_processes() -> List[psutil.Process]:
    """Every live process running one of our rank actors below this one (its fake cluster's raylets start them).

    Only this process's own: pytest-xdist may run another Ray test file beside this one, whose cluster's actors are
    alive on purpose."""
    found = []
    for process in _children(psutil.Process()):
        try:
            if ACTOR_TITLE in command_line(process) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            pass   # ended meanwhile
    return found


def leftovers(ray: Any, timeout: float = 60.0) -> List[str]:
    """What a launch or session left on the cluster (waiting up to ``timeout`` s for it to go): rank actors'
    processes and placement groups not removed. Empty when nothing is left."""
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + timeout
    while True:
        found = [f"actor process {process.pid}" for process in rank_actor_processes()]
        found += [f"placement group {group_id} ({table['state']})"
                  for group_id, table in placement_group_table().items() if table["state"] != "REMOVED"]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def command_line(process: psutil.Process) -> str:
    """What the process runs (its whole command line, which for Ray's processes names their temp dir); "?" once it is
    gone."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "?"
