"""A promise of docs/dashboard.md (issue 17 §3, item 8): each rank's GPU figures come from *its* GPU, "mapped
through LOCAL_RANK and CUDA_VISIBLE_DEVICES" — with CUDA's index order (``CUDA_DEVICE_ORDER``) told apart from
NVML's (PCI bus).

There is no GPU on the test machine, so NVML is a fake (as in tests/test_debugging.py): a stand-in for
nvidia-ml-py's ``pynvml`` describing GPUs by PCI order, the way the real library numbers them. The kernel-side
mapping (``notebook_accel.monitor.resources``) is real.
"""
from __future__ import annotations

import os

import pytest

from notebook_accel.monitor.resources import ResourceSampler
from notebook_accel.wire.events import LaunchStarted, RankStarted

GIB = 2 ** 30


class FakeNvml:
    """A fake ``pynvml`` (no GPU here): ``models`` in NVML's index order (PCI bus order); GPU i uses i+1 GiB."""

    class _Info:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    def __init__(self, *models: str):
        self.models = models

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.models)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.models):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])  # "GPU-fake-3" is NVML's GPU 3

    def nvmlDeviceGetName(self, handle):
        return self.models[handle]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Info(used=(handle + 1) * GIB, total=24 * GIB, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._Info(gpu=10 * handle, memory=0)


def nvml_gpu_of_each_rank(nvml, ranks=(0, 1), *, node_ranks=None, **gpu_options):
    """{rank: the NVML index whose memory the rank was shown with (None: no GPU figures)}."""
    samples = []
    sampler = ResourceSampler(samples.append, device="cuda", nvml=nvml, **gpu_options)
    if node_ranks is not None:  # a multi-node launch: this node runs these global ranks
        sampler.observe(LaunchStarted(rank=-1, world_size=4, device="cuda", start_method="fork", num_nodes=2,
                                      node_rank=1, ranks=list(node_ranks)))
    for rank in ranks:
        sampler.observe(RankStarted(rank=rank, pid=os.getpid()))
    sampler.tick(now=100.0)
    sampler.close()
    return {sample.rank: None if sample.device_used is None else sample.device_used // GIB - 1 for sample in samples}


MIXED = ("NVIDIA GeForce GT 1030", "NVIDIA GeForce RTX 4090")  # PCI order: the slow display card first



@pytest.fixture(autouse=True)
def visible_devices_unset(monkeypatch):
    """The fake NVML describes its own GPUs: this machine's CUDA_VISIBLE_DEVICES (a user's own, or the suite's ""
    on a GPU machine, conftest.py) must not choose among them where a test leaves it to the environment."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

def test_under_pci_bus_id_cudas_indexes_are_nvmls():
    nvml = FakeNvml(*MIXED)
    assert nvml_gpu_of_each_rank(nvml, visible_devices=None, device_order="PCI_BUS_ID") == {0: 0, 1: 1}
    assert nvml_gpu_of_each_rank(nvml, visible_devices="1,0", device_order="PCI_BUS_ID") == {0: 1, 1: 0}


def test_fastest_first_with_several_models_shows_no_figures_rather_than_another_gpus():
    # CUDA's default order puts the RTX 4090 (NVML's 1) first: CUDA index 0 is not NVML index 0 here.
    nvml = FakeNvml(*MIXED)
    assert nvml_gpu_of_each_rank(nvml, visible_devices=None, device_order="FASTEST_FIRST") == {0: None, 1: None}
    assert nvml_gpu_of_each_rank(nvml, visible_devices=None, device_order="") == {0: None, 1: None}  # the default
    # UUIDs name one GPU whatever the order
    assert nvml_gpu_of_each_rank(nvml, visible_devices="GPU-fake-1,GPU-fake-0") == {0: 1, 1: 0}


def test_fastest_first_with_one_model_is_the_pci_order():
    nvml = FakeNvml("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    assert nvml_gpu_of_each_rank(nvml, visible_devices="2,0", device_order="FASTEST_FIRST") == {0: 2, 1: 0}


def test_the_order_is_read_from_the_environment_as_the_ranks_read_it(monkeypatch):
    nvml = FakeNvml(*MIXED)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert nvml_gpu_of_each_rank(nvml, visible_devices="") == {0: None, 1: None}  # "": no GPU is visible
    assert nvml_gpu_of_each_rank(nvml, visible_devices="0,1") == {0: 0, 1: 1}
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    assert nvml_gpu_of_each_rank(nvml, visible_devices="0,1") == {0: None, 1: None}


@pytest.mark.parametrize("visible", [None, "0,1"])
def test_on_a_second_node_the_gpu_is_the_local_ranks_not_the_global_ranks(visible):
    # Node 1 of 2 runs global ranks 2 and 3: their LOCAL_RANK is 0 and 1, so they use this node's GPUs 0 and 1.
    nvml = FakeNvml("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB")
    assert nvml_gpu_of_each_rank(nvml, ranks=(2, 3), node_ranks=(2, 3), visible_devices=visible,
                                 device_order="PCI_BUS_ID") == {2: 0, 3: 1}
