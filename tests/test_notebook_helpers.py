"""Helpers the example notebooks define for themselves, tested as the notebook has them (issue 46).

``notebooks/ray_cluster.ipynb`` starts a fake two-node Ray cluster when the kernel has none, and Ray gives each node
a fixed 30 s to register: on a busy laptop the first start can miss it ("The current node timed out during
startup"). The notebook's ``start_fake_cluster`` tries once more and otherwise says what to do. Making a real raylet
miss its 30 s on demand would take a machine kept busy for a minute or more, so ``ray.cluster_utils.Cluster`` is
replaced here by one whose first start fails with Ray's own exception — its message read from the installed Ray's
source, so the stand-in fails exactly as Ray does (and this test fails when Ray rewords it). The notebook's nbval run
(notebooks/) starts the real fake cluster.
"""
from __future__ import annotations

import ast
import json
import os
import re
import sys
import types

import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "ray_cluster.ipynb")


def rays_own_startup_timeout_message() -> str:
    ray = pytest.importorskip("ray", reason="the ray extra")
    source = open(os.path.join(os.path.dirname(ray.__file__), "_private", "node.py")).read()
    found = re.search(r'"(The current node timed out during startup\.[^"]*)"\s*"([^"]*)"\s*"([^"]*)"', source)
    assert found, "Ray no longer says 'The current node timed out during startup': update the notebook's check"
    return "".join(found.groups())


def notebooks_start_fake_cluster():
    """``start_fake_cluster`` exactly as the notebook's first code cell defines it."""
    cells = json.load(open(NOTEBOOK))["cells"]
    source = next("".join(cell["source"]) for cell in cells
                  if cell["cell_type"] == "code" and "def start_fake_cluster" in "".join(cell["source"]))
    tree = ast.parse(source)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "start_fake_cluster")
    namespace: dict = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), NOTEBOOK, "exec"), namespace)
    return namespace["start_fake_cluster"]


class ClusterStandIn:
    """``ray.cluster_utils.Cluster`` whose first ``failures`` starts fail as Ray's do on a busy machine."""

    made: list = []
    failures = 0
    error = "The current node timed out during startup."

    def __init__(self) -> None:
        self.nodes, self.shut_down = 0, False
        ClusterStandIn.made.append(self)

    def add_node(self, **options) -> None:
        if len(ClusterStandIn.made) <= ClusterStandIn.failures:
            raise Exception(ClusterStandIn.error)  # Ray raises a bare Exception here (ray/_private/node.py)
        self.nodes += 1

    def wait_for_nodes(self) -> None:
        assert self.nodes == 2

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def cluster_stand_in(monkeypatch):
    ClusterStandIn.made, ClusterStandIn.error = [], rays_own_startup_timeout_message()
    monkeypatch.setitem(sys.modules, "ray.cluster_utils", types.SimpleNamespace(Cluster=ClusterStandIn))
    return ClusterStandIn


def test_a_first_start_that_misses_rays_wait_is_tried_again(cluster_stand_in, capsys):
    cluster_stand_in.failures = 1
    cluster = notebooks_start_fake_cluster()()
    first, second = cluster_stand_in.made
    assert cluster is second and second.nodes == 2 and not second.shut_down
    assert first.shut_down  # its raylets and GCS do not outlive the failed try
    assert "missed its 30 s start-up wait" in capsys.readouterr().out


def test_a_machine_too_busy_for_every_try_gets_what_to_do(cluster_stand_in):
    cluster_stand_in.failures = 2
    with pytest.raises(RuntimeError) as raised:
        notebooks_start_fake_cluster()()
    message = str(raised.value)
    assert "did not start in 2 tries" in message and "RAY_ADDRESS=auto" in message
    assert "docs/troubleshooting.md" in message and all(made.shut_down for made in cluster_stand_in.made)
    heading = re.search(r'"(Ray: the current node timed out during startup)"', message, re.IGNORECASE)
    troubleshooting = open(os.path.join(os.path.dirname(NOTEBOOK), "..", "docs", "troubleshooting.md")).read()
    headings = [line[3:].replace('"', "").lower() for line in troubleshooting.splitlines() if line.startswith("## ")]
    assert heading and heading.group(1).lower() in headings  # the section it names exists


def test_any_other_start_failure_is_raised_as_itself(cluster_stand_in):
    cluster_stand_in.failures, cluster_stand_in.error = 1, "port 6379 is in use"
    with pytest.raises(Exception, match="port 6379 is in use"):
        notebooks_start_fake_cluster()()
    assert len(cluster_stand_in.made) == 1 and cluster_stand_in.made[0].shut_down
