"""Fake ``torch_xla.distributed.parallel_loader``: moves each batch to the device (real: in a background
thread, with a mark_step per batch)."""
import torch


def _to(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return type(batch)({key: _to(value, device) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        moved = [_to(value, device) for value in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


class PerDeviceLoader:
    def __init__(self, loader, device):
        self._loader, self._device = loader, device

    def __iter__(self):
        for batch in self._loader:
            yield _to(batch, self._device)

    def __len__(self):
        return len(self._loader)


class ParallelLoader:
    def __init__(self, loader, devices, **kwargs):
        self._loader, self._devices = loader, devices

    def per_device_loader(self, device):
        return PerDeviceLoader(self._loader, device)

    def close(self):
        pass


class MpDeviceLoader:
    def __init__(self, loader, device, **kwargs):
        self._loader, self._device = loader, device

    def __iter__(self):
        return iter(ParallelLoader(self._loader, [self._device]).per_device_loader(self._device))

    def __len__(self):
        return len(self._loader)
