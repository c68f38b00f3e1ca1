"""A transformers.Trainer script trained with the swarm: one call added.

    pip install 'p2pdl[hf]'
    python docs/examples/hf_trainer.py [EPOCHS] [PEER_INDEX] [MULTIADDR ...]

A tiny GPT-2 built from a config (no weights downloaded) learns the
documentation text that ships with Python, byte by byte, through the
Trainer.  Start one peer; it prints its addresses.  Start more with one of
them (within 30 s: a peer that sees no other for that long trains alone).  Each peer trains until the swarm took EPOCHS global steps (of 256
samples), then prints its loss log and a digest of its parameters: peers
that averaged every round print the same digest.
"""

import hashlib
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import p2pdl  # p2pdl
import p2pdl.hf  # p2pdl
from p2pdl.training import ExampleTask

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
peer = int(sys.argv[2]) if len(sys.argv) > 2 else 0
tokens = ExampleTask().train_tokens   # the corpus, one token per byte


class Windows(torch.utils.data.Dataset):
    """Windows of 64 bytes at random places (its own places for each peer)."""

    def __init__(self, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(tokens) - 64, (count,), generator=g)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        window = tokens[self.starts[i]:self.starts[i] + 64]
        return {"input_ids": window, "labels": window}


torch.manual_seed(0)   # every peer starts from the same parameters
model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2,
                                   n_head=2))
args = TrainingArguments(output_dir=f"hf-trainer-peer{peer}", per_device_train_batch_size=16,
                         learning_rate=3e-3, max_steps=10_000, logging_steps=5,
                         save_strategy="no", report_to="none", use_cpu=True,
                         disable_tqdm=True, data_seed=peer)
trainer = Trainer(model=model, args=args, train_dataset=Windows(200_000, seed=peer))
node = p2pdl.Node(initial_peers=sys.argv[3:]); print("peer:", *node.addrs, flush=True)  # p2pdl
opt = p2pdl.hf.collaborate(trainer, node=node, run_id="hf-example", target_batch_size=256, epochs=epochs, matchmaking_time=8.0, discovery_time=30.0)  # p2pdl
trainer.train()

losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
print(json.dumps({"losses": losses, "parameters": digest.hexdigest()[:16],
                  "statistics": opt.statistics(), "last_round": opt.last_round.outcome,
                  "logged": {k: v for k, v in trainer.state.log_history[0].items()
                             if k.startswith("p2pdl_")}}), flush=True)
opt.close(); node.shutdown()  # p2pdl
