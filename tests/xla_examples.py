"""The seeds' Transformer loop with the Accelerator, as launched on XLA by test_xla_launch (fake torch_xla) and
test_xla_real (torch_xla's CPU client)."""
from __future__ import annotations

from typing import Any, Dict


def transformer_example(epochs: int = 4) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)  # device threads share one RNG: prepare() gives every replica rank 0's weights
    model = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=32, dropout=0.0, batch_first=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    source = torch.randn(64, 5, 16, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(source, source.flip(1)), batch_size=8, shuffle=True)  # reverse a sequence

    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    model.train()
    losses = []
    for _ in range(epochs):
        for inputs, targets in data:
            optimizer.zero_grad()
            loss = F.mse_loss(model(inputs, targets), targets)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    ranks = accelerator.gather(torch.tensor([accelerator.process_index]).to(accelerator.device))
    return {
        "kind": accelerator.distributed_type.value, "device": accelerator.device.type,
        "world": accelerator.num_processes, "rank": accelerator.process_index,
        "precision": accelerator.mixed_precision, "loader": type(data).__name__,
        "losses": losses, "ranks": ranks.cpu().tolist(),
        "objects": accelerator.gather_for_metrics([f"rank {accelerator.process_index}"]),
        "weights": {name: value.detach().cpu() for name, value in
                    accelerator.unwrap_model(model).state_dict().items()},
    }


def uneven_epoch_example(samples: int = 21, batch_size: int = 2, accumulation: int = 4) -> Dict[str, Any]:
    """An eval set that does not split evenly, and gradient accumulation whose last cycle is cut short by the
    epoch's end: on XLA the prepared loader is torch_xla's MpDeviceLoader, which takes batches from it ahead
    of the user (a prefetch thread). What must hold is what the user's batch says, not the prefetcher's:
    ``gather_for_metrics`` returns exactly ``samples`` values, and ``sync_gradients`` is True every
    ``accumulation`` batches *and* at the epoch's last batch (else its gradients are never applied)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values = torch.arange(samples, dtype=torch.float32).unsqueeze(1)
    data = DataLoader(TensorDataset(values), batch_size=batch_size)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    gathered, syncs, batches = [], [], 0
    for (inputs,) in data:
        batches += 1
        with accelerator.accumulate(model):
            loss = model(inputs).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            syncs.append(batches)
        gathered += accelerator.gather_for_metrics(inputs.squeeze(1)).cpu().tolist()
    return {"gathered": sorted(gathered), "syncs": syncs, "batches": batches, "rank": accelerator.process_index,
            "world": accelerator.num_processes}
