"""plain_loop.py, trained together with every peer of the run: three lines added.

Start one peer; it prints its addresses.  Start more (other terminals or
machines) with one of them:

    python docs/examples/collaborative_loop.py 300
    python docs/examples/collaborative_loop.py 300 /ip4/192.0.2.1/tcp/40111/p2p/12D3KooW...

The peers' batches add up to a global batch of 256 samples; then they
average their gradients and step together, so all hold the same model.
"""

import os
import sys

import torch

import p2pdl  # p2pdl
from p2pdl.training import ExampleTask

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
task = ExampleTask()
model = task.build_model()
batches = task.batches(os.getpid())  # a data order of its own
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
node = p2pdl.Node(initial_peers=sys.argv[2:]); print("peer:", *node.addrs)  # p2pdl
optimizer = p2pdl.Optimizer(node=node, run_id="example", optimizer=optimizer, target_batch_size=256, batch_size_per_step=16)  # p2pdl

for step in range(steps):
    loss = model.loss(next(batches))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 50 == 0:
        print(f"step {step}: loss {loss.item():.3f}", flush=True)
print(f"held-out loss: {task.validation_loss(model, max_batches=8):.3f}")
