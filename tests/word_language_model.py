"""The seeds' Transformer tutorial (PyTorch's "Language Modeling with nn.Transformer": ``TransformerModel`` =
embedding + positional encoding + ``nn.TransformerEncoder`` + a linear decoder, trained on bptt-long windows with
cross-entropy, ``clip_grad_norm_(0.5)``, SGD and a per-epoch ``StepLR``), ported to the Accelerator, on made-up
tokens (no download): a repeating token sequence the model can learn, so the loss falls within a few epochs.

``run_tutorial(plugins)`` is the loop a user would write; test_fsdp and test_deepspeed run it under FSDP2 and
ZeRO-3 on 2 ranks.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NTOKENS, BPTT = 50, 16


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [seq_len, batch, d_model]
        return self.dropout(x + self.pe[: x.size(0)])


class TransformerModel(nn.Module):
    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int, nlayers: int, dropout: float = 0.2):
        super().__init__()
        self.model_type = "Transformer"
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        encoder_layers = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(encoder_layers, nlayers)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.linear.bias.data.zero_()
        self.linear.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, src_mask)
        return self.linear(output)  # [seq_len, batch, ntoken]


def made_up_corpus(windows: int = 64) -> TensorDataset:
    """(input, target) windows of a token stream with structure: the next token is (token * 7 + 3) % NTOKENS."""
    stream = [1]
    for _ in range(windows * BPTT):
        stream.append((stream[-1] * 7 + 3) % NTOKENS)
    data = torch.tensor(stream)
    inputs = torch.stack([data[i * BPTT : (i + 1) * BPTT] for i in range(windows)])
    targets = torch.stack([data[i * BPTT + 1 : (i + 1) * BPTT + 1] for i in range(windows)])
    return TensorDataset(inputs, targets)


def run_tutorial(epochs: int = 3, **accelerator_options: Any) -> Dict[str, Any]:
    """The tutorial's train loop with the Accelerator; returns the mean loss per epoch and what was built."""
    from notebook_accel import Accelerator

    accelerator = Accelerator(cpu=True, **accelerator_options)
    torch.manual_seed(0)
    model = TransformerModel(NTOKENS, d_model=32, nhead=2, d_hid=64, nlayers=2, dropout=0.0)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
    loader = DataLoader(made_up_corpus(), batch_size=4, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    src_mask = nn.Transformer.generate_square_subsequent_mask(BPTT)
    losses = []
    for _ in range(epochs):
        model.train()
        total = torch.zeros(())
        for data, targets in loader:
            data, targets = data.t(), targets.t()  # the tutorial's [seq_len, batch] layout
            output = model(data, src_mask)
            loss = criterion(output.reshape(-1, NTOKENS).float(), targets.reshape(-1))
            optimizer.zero_grad()
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total += loss.detach().float()
        losses.append(accelerator.reduce(total / len(loader), "mean").item())
        scheduler.step()
    weights = accelerator.get_state_dict(model)
    return {"losses": losses, "model": model, "accelerator": accelerator, "lr": optimizer.param_groups[0]["lr"],
            "weights": {name: tuple(value.shape) for name, value in weights.items()}}
