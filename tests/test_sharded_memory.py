"""A sharded CPU rank gives large freed blocks back to the system at once (glibc's fixed mmap threshold), so
its memory follows what it holds instead of glibc's heap keeping every step's freed blocks (see
``notebook_accel.accelerator.memory.return_large_blocks_when_freed``; the peak memory it saves is measured in
``benchmarks/bench_sharded.py``). Real ranks, real glibc: the test reads glibc's own accounting (``mallinfo2``)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

import pytest
import torch

from notebook_accel import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
from notebook_accel.accelerator.memory import return_large_blocks_when_freed
from test_accelerator_distributed import launch

MiB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mapped_bytes() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2().hblkhd  # bytes in blocks glibc mapped by themselves (outside its heap)


def where_a_6_mib_block_goes(plugin: str, threshold_mib: Optional[str]) -> str:
    """Where glibc puts a 6 MiB block after this rank's Accelerator is made, once a 24 MiB block was freed (which,
    left to glibc, raises its threshold to 24 MiB: the next blocks up to that size come from its heap)."""
    if threshold_mib is not None:
        os.environ["NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB"] = threshold_mib
    if plugin == "FSDP2":
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    elif plugin == "ZeRO-2":
        Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    else:
        Accelerator(cpu=True)
    big = torch.ones(24 * MiB // 4)
    del big
    before = _mapped_bytes()
    block = torch.ones(6 * MiB // 4)  # touched: a real allocation, not only reserved
    grown = _mapped_bytes() - before
    del block
    return "own mapping" if grown >= 6 * MiB else "heap"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps") or ctypes.util.find_library("c") is None,
                    reason="glibc's malloc (Linux) is what this tunes")
@pytest.mark.parametrize("plugin, threshold, expected", [
    ("FSDP2", None, "own mapping"),
    ("ZeRO-2", None, "own mapping"),
    ("FSDP2", "0", "heap"),   # turned off: glibc as it is
    ("FSDP2", "32", "heap"),  # 32 MiB: the 6 MiB block is under it
    ("DDP", None, "heap"),    # replicated training: nothing changed
])
def test_a_sharded_cpu_rank_maps_each_large_block_by_itself(plugin, threshold, expected):
    if plugin == "ZeRO-2":
        pytest.importorskip("deepspeed", reason="DeepSpeed is an optional extra: pip install '.[deepspeed]'")
    # Spawned, not forked: a forked rank starts with a copy of this process's glibc heap, and after earlier tests of
    # the same pytest process (a block freed above glibc's raised threshold, then a larger one carved and freed) that
    # heap holds free chunks of several MiB, from which glibc serves the 6 MiB block before it would map one — "heap"
    # in both ranks, in full runs only. A spawned rank's heap is its own, as on a fresh kernel.
    ranks = launch(where_a_6_mib_block_goes, plugin, threshold, start_method="spawn")
    assert ranks == [expected] * len(ranks)


def test_the_users_own_glibc_setting_and_a_bad_size_are_respected_or_refused():
    assert return_large_blocks_when_freed({"MALLOC_MMAP_THRESHOLD_": "65536"}) is None  # theirs: left alone
    assert return_large_blocks_when_freed({"NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB": "0"}) is None
    with pytest.raises(ValueError, match="NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB='four'.*MiB"):
        return_large_blocks_when_freed({"NOTEBOOK_ACCEL_MMAP_THRESHOLD_MIB": "four"})
