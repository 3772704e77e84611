"""The demo job: a small MLP on scikit-learn's handwritten digits (shipped with the package, no download),
trained over 2 CPU processes with the four-line ``Accelerator`` API.

    python -m notebook_accel.demo                 # 2 processes, text display
    python -m notebook_accel.demo --processes 1 --epochs 5

The same ``train`` function runs unchanged in a notebook cell with ``notebook_launcher(train, ...)``.
"""
from __future__ import annotations

import argparse
import time
from typing import Dict


def load_digits_tensors():
    """The 1,797 8×8 digit images of scikit-learn as float tensors in [0, 1], and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise SystemExit("the demo needs scikit-learn: pip install 'notebook_accel[demo]'") from err
    import torch

    digits = load_digits()
    return torch.tensor(digits.data / 16.0, dtype=torch.float32), torch.tensor(digits.target)


def train(epochs: int = 10, batch_size: int = 64, lr: float = 3e-3, seed: int = 0) -> Dict[str, object]:
    """One training run; returns the final accuracy on held-out digits and the model's weights."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, progress, report

    accelerator = Accelerator(seed=seed)
    images, labels = load_digits_tensors()
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=generator)
    train_idx, eval_idx = order[:1500], order[1500:]
    train_loader = DataLoader(TensorDataset(images[train_idx], labels[train_idx]), batch_size=batch_size,
                              shuffle=True)
    eval_loader = DataLoader(TensorDataset(images[eval_idx], labels[eval_idx]), batch_size=batch_size)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    accuracy = 0.0
    for epoch in progress(range(epochs), desc="epochs"):
        model.train()
        for inputs, targets in progress(train_loader, desc=f"epoch {epoch}", leave=False):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for inputs, targets in eval_loader:
                predictions = accelerator.gather_for_metrics((model(inputs).argmax(dim=1), targets))
                correct += int((predictions[0] == predictions[1]).sum())
                total += len(predictions[1])
        accuracy = correct / total
        last_loss = loss.item()  # a plain number (float() on a tensor that requires grad warns)
        report(step=epoch, loss=last_loss, accuracy=accuracy)
        accelerator.print(f"epoch {epoch}: loss {last_loss:.3f}, held-out accuracy {accuracy:.3f} ({total} digits)")
    state = accelerator.unwrap_model(model).state_dict()
    accelerator.end_training()
    return {"accuracy": accuracy, "state_dict": state, "world_size": accelerator.num_processes}


def main(argv=None) -> None:
    from notebook_accel import notebook_launcher

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--display", default="text", choices=["text", "none", "auto"])
    options = parser.parse_args(argv)
    started = time.perf_counter()
    outcome = notebook_launcher(train, kwargs={"epochs": options.epochs}, num_processes=options.processes,
                                device="cpu", display=options.display)
    print(f"trained on {outcome['world_size']} CPU processes in {time.perf_counter() - started:.1f} s: "
          f"held-out accuracy {outcome['accuracy']:.3f}")


if __name__ == "__main__":
    main()
