"""A plain PyTorch training loop on the built-in example task (one machine).

    python docs/examples/plain_loop.py [STEPS]

collaborative_loop.py is this file with three lines added (marked ``# p2pdl``).
"""

import os
import sys

import torch

from p2pdl.training import ExampleTask

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
task = ExampleTask()
model = task.build_model()
batches = task.batches(os.getpid())  # a data order of its own
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for step in range(steps):
    loss = model.loss(next(batches))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 50 == 0:
        print(f"step {step}: loss {loss.item():.3f}", flush=True)
print(f"held-out loss: {task.validation_loss(model, max_batches=8):.3f}")
