"""Memory and load of every rank, sampled in the kernel about once a second.

Why in the kernel and not in the ranks: a rank that is stuck, swapping or about to be OOM-killed is exactly
the one that cannot report about itself, and the kernel already knows every rank's pid (``RankStarted``).

* Host: psutil, the rank's process plus its children (DataLoader workers, compilers), summed: RSS, and
  CPU use as a percentage of one core from the difference of CPU times between two samples.
* GPU: NVML (``nvidia-ml-py``, optional, imported lazily). NVML talks to the driver, not to CUDA, so the
  kernel never initializes CUDA (which would make fork unsafe). A rank's GPU is the one torchrun's
  convention gives it: ``LOCAL_RANK`` (the rank's place on this node, not its global rank), through
  ``CUDA_VISIBLE_DEVICES`` when set (indexes or UUIDs). CUDA's indexes follow ``CUDA_DEVICE_ORDER``
  (``FASTEST_FIRST`` by default) while NVML's follow the PCI bus: they agree under ``PCI_BUS_ID`` or when every
  GPU is the same model; otherwise an index names no GPU NVML could tell, and no GPU figures are shown for it
  (rather than another GPU's).
* The rank's own framework figure (``torch.cuda.max_memory_allocated``, torch_xla's memory info) arrives
  as ``DeviceMemoryReport`` events and is folded into the next sample.

Example::

    sampler = ResourceSampler(device="cuda", deliver=view.handle)
    sampler.observe(event)        # every event (learns pids from RankStarted)
    sampler.tick()                # often; samples when a second has passed
    sampler.peaks()               # {rank: (peak rss, peak device bytes)} for an OOM explanation
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import psutil

from ..formatting import format_bytes
from ..wire.events import (DeviceMemoryReport, LaunchStarted, PeakMemoryReport, RankEvent, RankExited, RankStarted,
                           ResourceSample)

SAMPLE_INTERVAL = 1.0  # seconds between two samples of all ranks


@dataclass
class _Tracked:
    rank: int
    process: psutil.Process
    include_children: bool
    cpu_seconds: Optional[float] = None
    sampled_at: Optional[float] = None
    peak_rss: int = 0
    device_peak: int = 0
    framework: Optional[DeviceMemoryReport] = None
    children: Optional[Dict[int, psutil.Process]] = None  # kept between samples: psutil caches per Process
    last_sample: Optional[ResourceSample] = None           # the latest delivered (its device figures are kept)


class ResourceSampler:
    """Samples each started rank every ``interval`` seconds and hands ``ResourceSample`` events to ``deliver``."""

    def __init__(self, deliver: Callable[[RankEvent], None], *, device: str = "cpu",
                 interval: float = SAMPLE_INTERVAL, nvml: Any = None,
                 visible_devices: Optional[str] = None, device_order: Optional[str] = None) -> None:
        self.deliver = deliver
        self.device = device
        self.interval = interval
        self._ranks: Dict[int, _Tracked] = {}
        self._last_sample = 0.0
        self._gpu = GpuMonitor(nvml, visible_devices, device_order) if device == "cuda" else None
        self._first_rank = 0  # this node's lowest global rank: a rank's LOCAL_RANK is its rank minus this
        self.samples = 0

    def postpone_sample(self) -> None:
        """Take the next sample one interval from now, not at the first tick (a warm session's run may be over
        in milliseconds; psutil's scan of every process costs a few)."""
        self._last_sample = time.monotonic()

    def observe(self, event: RankEvent) -> None:
        """Learn pids from ``RankStarted``, forget exited ranks, keep the ranks' framework memory figures."""
        if isinstance(event, LaunchStarted):  # on node 1 of 2 (2 ranks each) ranks 2 and 3 use local GPUs 0 and 1
            self._first_rank = min(event.ranks) if event.ranks else 0
        elif isinstance(event, RankStarted):
            if event.reports_resources:  # on another machine: it samples itself; only its peaks are kept here
                self._ranks[event.rank] = _Tracked(event.rank, None, include_children=False)  # type: ignore[arg-type]
                return
            try:
                process = psutil.Process(event.pid)
            except psutil.Error:
                # Gone already (a short run, its events read after its end on a busy machine): nothing to sample,
                # but the peak it reported comes next and is still its row's.
                self._ranks[event.rank] = _Tracked(event.rank, None, include_children=False)  # type: ignore[arg-type]
                return
            # A rank running in the kernel itself (inline): its children are the kernel's, not the rank's.
            self._ranks[event.rank] = _Tracked(event.rank, process, include_children=event.pid != os.getpid())
        elif isinstance(event, ResourceSample):
            tracked = self._ranks.get(event.rank)
            if tracked is not None and tracked.process is None:  # a rank's own sample (or one after its end)
                tracked.peak_rss = max(tracked.peak_rss, event.peak_rss or event.rss or 0)
                tracked.last_sample = event
        elif isinstance(event, PeakMemoryReport):
            tracked = self._ranks.get(event.rank)
            if tracked is not None and event.peak_rss > tracked.peak_rss:
                tracked.peak_rss = event.peak_rss
                last = tracked.last_sample or ResourceSample(rank=event.rank)
                tracked.last_sample = dataclasses.replace(last, peak_rss=tracked.peak_rss, time=time.time())
                self.deliver(tracked.last_sample)
        elif isinstance(event, DeviceMemoryReport):
            tracked = self._ranks.get(event.rank)
            if tracked is not None:
                tracked.framework = event
        elif isinstance(event, RankExited):
            tracked = self._ranks.get(event.rank)
            if tracked is not None:
                tracked.children = None
                tracked.process = None  # type: ignore[assignment]  # keep the peaks, stop sampling

    def tick(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._last_sample < self.interval:
            return
        self._last_sample = now
        for tracked in list(self._ranks.values()):
            if tracked.process is not None:
                sample = self.sample(tracked, now)
                if sample is not None:
                    self.samples += 1
                    tracked.last_sample = sample
                    self.deliver(sample)

    def sample(self, tracked: _Tracked, now: float) -> Optional[ResourceSample]:
        rss, cpu_seconds = _host_usage(tracked)
        if rss is None:
            return None
        cpu_percent = None
        if tracked.cpu_seconds is not None and tracked.sampled_at is not None and now > tracked.sampled_at:
            cpu_percent = max(0.0, 100.0 * (cpu_seconds - tracked.cpu_seconds) / (now - tracked.sampled_at))
        tracked.cpu_seconds, tracked.sampled_at = cpu_seconds, now
        tracked.peak_rss = max(tracked.peak_rss, rss)
        sample = ResourceSample(rank=tracked.rank, rss=rss, peak_rss=tracked.peak_rss, cpu_percent=cpu_percent)
        if self._gpu is not None:
            used, total, util = self._gpu.usage(tracked.rank - self._first_rank)
            if used is not None:
                tracked.device_peak = max(tracked.device_peak, used)
                sample.device_used, sample.device_total, sample.device_peak = used, total, tracked.device_peak
                sample.device_util = util
        framework = tracked.framework
        if framework is not None:
            sample.device_peak_allocated = framework.peak_allocated
            if framework.used is not None and sample.device_used is None:  # TPU: what torch_xla reports
                tracked.device_peak = max(tracked.device_peak, framework.used)
                sample.device_used, sample.device_total = framework.used, framework.total
                sample.device_peak = tracked.device_peak
        return sample

    def latest(self) -> Dict[int, ResourceSample]:
        """The latest sample of each rank (taken here, or sent by a rank that samples itself)."""
        return {rank: tracked.last_sample for rank, tracked in self._ranks.items() if tracked.last_sample is not None}

    def peaks(self) -> Dict[int, Tuple[int, Optional[int]]]:
        """{rank: (peak host RSS, peak device bytes or None)} over the launch so far."""
        result = {}
        for rank, tracked in sorted(self._ranks.items()):
            framework = tracked.framework
            torch_peak = max(framework.peak_allocated or 0, framework.peak_reserved or 0) if framework else 0
            device = max(tracked.device_peak, torch_peak)  # NVML's (context included) or torch's allocator's
            result[rank] = (tracked.peak_rss, device or None)
        return result

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()


def _host_usage(tracked: _Tracked) -> Tuple[Optional[int], float]:
    """(RSS bytes, CPU seconds) of the rank and, for a process rank, its children (DataLoader workers)."""
    try:
        with tracked.process.oneshot():
            rss = tracked.process.memory_info().rss
            times = tracked.process.cpu_times()
            cpu = times.user + times.system
    except psutil.Error:  # the rank is gone
        return None, 0.0
    if rss == 0:  # a zombie: the rank has exited and not been reaped yet (a live process never has 0 RSS)
        return None, 0.0
    if tracked.include_children:
        known = tracked.children or {}
        current: Dict[int, psutil.Process] = {}
        for child in _descendants(tracked.process, known):
            child = known.get(child.pid, child)
            try:
                with child.oneshot():
                    rss += child.memory_info().rss
                    times = child.cpu_times()
                    cpu += times.user + times.system
                current[child.pid] = child
            except psutil.Error:
                pass
        tracked.children = current
    return rss, cpu


def _descendants(process: psutil.Process, known: Dict[int, psutil.Process]) -> List[psutil.Process]:
    """Every process below ``process``. On Linux from the children its threads list in /proc (a few small reads
    per rank); psutil's ``children(recursive=True)`` reads the stat file of every process on the machine, once
    per rank and sample: on a busy machine with 16 ranks, most of the kernel's work while they start."""
    if not _PROC_CHILDREN:
        try:
            return process.children(recursive=True)
        except psutil.Error:
            return []
    found: List[psutil.Process] = []
    parents = [process.pid]
    while parents:
        for pid in _child_pids(parents.pop()):
            try:
                child = known.get(pid) or psutil.Process(pid)
            except psutil.Error:  # already gone
                continue
            found.append(child)
            parents.append(pid)
    return found


def _child_pids(pid: int) -> List[int]:
    """The pids of ``pid``'s children (each thread lists those it started); [] once it is gone."""
    children: List[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as listed:
                children.extend(int(child) for child in listed.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return children


# Linux with CONFIG_PROC_CHILDREN (every major distribution's kernel) lists each thread's children.
_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


class GpuMonitor:
    """NVML figures of each rank's GPU, without initializing CUDA. Inactive (all None) without NVML.

    ``nvml`` is the ``pynvml`` module of nvidia-ml-py (imported on first use when None; tests pass a fake).
    """

    def __init__(self, nvml: Any = None, visible_devices: Optional[str] = None,
                 device_order: Optional[str] = None) -> None:
        self._nvml = nvml
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible_devices is None else visible_devices
        # CUDA numbers devices fastest first unless told PCI_BUS_ID (NVML's order); read as the ranks read it.
        order = os.environ.get("CUDA_DEVICE_ORDER", "") if device_order is None else device_order
        self._pci_order = order.strip().upper() == "PCI_BUS_ID"
        self._indexes_agree: Optional[bool] = None  # do CUDA's indexes name the same GPUs as NVML's?
        self._handles: Dict[int, Any] = {}
        self._ready: Optional[bool] = None

    def _start(self) -> bool:
        if self._ready is None:
            try:
                if self._nvml is None:
                    import pynvml  # nvidia-ml-py: optional

                    self._nvml = pynvml
                self._nvml.nvmlInit()
                self._ready = True
            except Exception:  # no package, no driver, no permission: no GPU figures, nothing else changes
                self._ready = False
        return bool(self._ready)

    def device_of(self, local_rank: int) -> Optional[str]:
        """The NVML identity of ``local_rank``'s GPU: an index ("3") or a UUID ("GPU-..."), or None."""
        if self._visible is None or self._visible.strip() == "":
            return str(local_rank) if self._visible is None else None
        entries = [entry.strip() for entry in self._visible.split(",") if entry.strip()]
        return entries[local_rank] if local_rank < len(entries) else None

    def _nvml_index(self, cuda_index: int) -> Optional[int]:
        """NVML's index of the GPU CUDA numbers ``cuda_index``, or None when that cannot be known.

        NVML numbers GPUs by PCI bus id. CUDA does so only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; by default
        (``FASTEST_FIRST``) it puts the fastest first by a heuristic it does not document; among GPUs of one model
        that is the PCI order in practice. With several models the two orders can differ, and a guess would show
        another GPU's memory as this rank's: no figures then (set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or use UUIDs in
        ``CUDA_VISIBLE_DEVICES`` to get them).
        """
        if self._pci_order:
            return cuda_index
        if self._indexes_agree is None:
            try:
                nvml = self._nvml
                names = {nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
                         for index in range(nvml.nvmlDeviceGetCount())}
                self._indexes_agree = len(names) <= 1
            except Exception:  # an NVML without these queries: assume one model, as almost every machine has
                self._indexes_agree = True
        return cuda_index if self._indexes_agree else None

    def usage(self, local_rank: int) -> Tuple[Optional[int], Optional[int], Optional[float]]:
        """(used bytes, total bytes, utilization %) of ``local_rank``'s GPU."""
        if not self._start():
            return None, None, None
        try:
            handle = self._handles.get(local_rank)
            if handle is None:
                identity = self.device_of(local_rank)
                if identity is None:
                    return None, None, None
                nvml = self._nvml
                if identity.isdigit():  # an index in CUDA's order
                    index = self._nvml_index(int(identity))
                    if index is None:
                        return None, None, None
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                else:
                    handle = nvml.nvmlDeviceGetHandleByUUID(identity)
                self._handles[local_rank] = handle
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util: Optional[float] = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # some devices (MIG slices) have no utilization counter
                util = None
            return int(memory.used), int(memory.total), util
        except Exception:
            return None, None, None

    def close(self) -> None:
        if self._ready:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        self._ready = None
        self._handles.clear()


def ranks_by_peak(peaks: Dict[int, Tuple[int, Optional[int]]], device: bool) -> List[str]:
    """``["rank 0: 7.9 GB", ...]`` for the OOM explanation."""
    return [f"rank {rank}: {format_bytes(dev if device else rss)}" for rank, (rss, dev) in sorted(peaks.items())]
