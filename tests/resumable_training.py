"""The training the Slurm time-limit tests run in their kernel scripts (``test_time_limit_slurm.py``,
``test_detached_slurm.py``), as source text: a small regression model, SGD with momentum (state worth keeping), each
step's data from its step number, so that a run resumed from a checkpoint ends with the weights of one never
interrupted."""
from __future__ import annotations

import textwrap

TRAIN = textwrap.dedent('''
    import time
    import torch
    import torch.nn.functional as F
    from notebook_accel import Accelerator
    from notebook_accel.accelerator import ProjectConfiguration

    def train(project_dir, total, pause=0.0, resume=None):
        """Steps of ``pause`` s up to ``total``, from the latest checkpoint when ``resume`` (None: when one exists)."""
        torch.set_num_threads(1)
        accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=project_dir,
                                                                      automatic_checkpoint_naming=True))
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = accelerator.prepare(model, optimizer)
        if accelerator.latest_checkpoint is not None if resume is None else resume:
            accelerator.load_state()
            print(f"resumed at step {accelerator.optimizer_steps}", flush=True)
        for step in range(accelerator.optimizer_steps, total):
            inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * step + accelerator.process_index))
            accelerator.backward(F.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True)))
            optimizer.step()
            optimizer.zero_grad()
            if step % 10 == 0:
                print(f"step {step}", flush=True)
            time.sleep(pause)
        return [value.tolist() for value in accelerator.unwrap_model(model).state_dict().values()]
''')
