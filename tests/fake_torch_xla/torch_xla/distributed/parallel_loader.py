"""Fake ``torch_xla.distributed.parallel_loader``, as hard as torch_xla 2.9's where our code depends on it:

- ``ParallelLoader`` iterates the wrapped loader in a daemon thread (``_loader_worker``) as soon as it is made,
  and a second daemon thread per device (``_worker``) moves the batches to the device: up to
  ``loader_prefetch_size`` + ``device_prefetch_size`` batches are taken from the wrapped loader before the user
  gets the first one, so anything that loader records per batch runs ahead of the batch the user holds;
- a batch goes through ``xm.send_cpu_data_to_device``'s rewrite: tensors moved, tuples turned into lists
  (dicts and lists kept, other objects passed through as they are);
- ``PerDeviceLoader.next`` cuts the graph (``torch_xla.sync()``) before each batch and once more at the end,
  and raises the first exception a worker thread hit (the loader thread's own end is ``StopIteration``).

Only the device move is fake (the "device" is the CPU).
"""
import collections
import itertools
import queue
import threading

import torch


def _to_device(value, device):
    """``xu.for_each_instance_rewrite`` with ``send_cpu_data_to_device``'s select: tensors moved, tuples to lists."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_device(item, device) for item in value]
    return value


class _ClosableQueue:
    """``torch_xla.utils.keyd_queue.Queue``: ``put`` waits for space unless the reader closed (then it drops the
    item); ``get`` returns None once the writer closed and nothing is left."""

    def __init__(self, maxsize):
        self._maxsize = maxsize
        self._items = collections.deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._close_read = self._close_write = False

    def max_size(self):
        return self._maxsize

    def close(self):
        with self._lock:
            self._close_read = self._close_write = True
            self._ready.notify_all()
            self._space.notify_all()

    def close_write(self):
        with self._lock:
            self._close_write = True
            self._ready.notify_all()

    def put(self, item):
        with self._lock:
            while len(self._items) >= self._maxsize and not self._close_read:
                self._space.wait()
            if not self._close_read:
                self._items.append(item)
                self._ready.notify()

    def get(self):
        with self._lock:
            while not self._items and not self._close_write:
                self._ready.wait()
            item = self._items.popleft() if self._items else None
            if item is not None:
                self._space.notify()
            return item


class PerDeviceQueue:
    def __init__(self, device, loader_prefetch_size, device_prefetch_size):
        self.device = device
        self.cpu_loader_queue = _ClosableQueue(loader_prefetch_size)
        self.queue = _ClosableQueue(device_prefetch_size)
        self.close_queue_count = itertools.count()


class PerDeviceLoader:
    def __init__(self, loader, device):
        self._loader = loader
        self._device = device
        self._sync_batch_count = loader.batches_per_execution - 1
        self._batches_yielded = 0

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def __len__(self):
        return self._loader.per_device_samples()

    def next(self):
        import torch_xla

        if self._sync_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            torch_xla.sync()
        else:
            self._batches_yielded += 1
        item = self._loader.next_item(self._device)
        if item is None:
            if not self._loader._exception_queue.empty():
                raise self._loader._exception_queue.get()
            torch_xla.sync()
            raise StopIteration
        return item


class ParallelLoader:
    def __init__(self, cpu_loader, devices, batchdim=0, batches_per_execution=1, loader_prefetch_size=16,
                 device_prefetch_size=8, host_to_device_transfer_threads=1, input_sharding=None):
        self._cpu_loader = cpu_loader
        self._devices = [torch.device(device) for device in devices]
        self._batches_per_execution = batches_per_execution
        self._done = False
        self._exception_queue = queue.Queue()
        self._queues = {index: PerDeviceQueue(device, loader_prefetch_size, device_prefetch_size)
                        for index, device in enumerate(self._devices)}
        self._threads = [threading.Thread(target=self._loader_worker, daemon=True)]
        for dqueue in self._queues.values():
            self._threads.append(threading.Thread(target=self._worker, args=(dqueue,), daemon=True))
        for thread in self._threads:
            thread.start()

    def per_device_loader(self, device):
        return PerDeviceLoader(self, self._index_of(device))

    def per_device_samples(self):
        return len(self._cpu_loader) // len(self._devices)

    def next_item(self, index):
        return self._queues[index].queue.get()

    def close(self):
        self._done = True
        for dqueue in self._queues.values():
            dqueue.queue.close()
            dqueue.cpu_loader_queue.close()
        for thread in self._threads:
            thread.join()

    @property
    def batches_per_execution(self):
        return self._batches_per_execution

    def _index_of(self, device):
        # the fake's devices are all torch.device("cpu"): the index is the position, as a key the real one uses
        return self._devices.index(torch.device(device))

    def _loader_worker(self):
        queues = list(self._queues.values())
        batch = []
        try:
            for data in self._cpu_loader:  # an exception here ends the thread, as in torch_xla (it is lost)
                if self._done:
                    break
                batch.append(data)
                if len(batch) == len(self._devices):
                    for queue_no, device_batch in enumerate(batch):
                        queues[queue_no].cpu_loader_queue.put(device_batch)
                    batch = []
        finally:
            for dqueue in queues:
                dqueue.cpu_loader_queue.close_write()

    def _worker(self, dqueue):
        try:
            while True:
                item = dqueue.cpu_loader_queue.get()
                if item is None:
                    break
                try:
                    with torch.no_grad():
                        moved = _to_device(item, dqueue.device)
                except Exception as exc:
                    self._exception_queue.put(exc)
                    break
                dqueue.queue.put(moved)
        finally:
            dqueue.queue.close_write()


class MpDeviceLoader:
    def __init__(self, loader, device, **kwargs):
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs
        self._parallel_loader = None

    def __iter__(self):
        if self._parallel_loader is not None:
            self._parallel_loader.close()
            self._parallel_loader = None
        self._parallel_loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        return self._parallel_loader.per_device_loader(self._device)

    def __len__(self):
        return len(self._loader)
