"""p2pdl.hf: a transformers.Trainer made collaborative with one call.

Needs ``transformers`` and ``accelerate`` (``pip install p2pdl[hf]``; the
test command installs them); skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import p2pdl  # noqa: E402
from p2pdl.errors import ConfigError  # noqa: E402
from p2pdl.hf import CollaborationCallback, EpochSchedule, collaborate  # noqa: E402

from ..training.fake_node import FakeNode  # noqa: E402
from ..training.fake_node import progress as fake_progress  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "hf_trainer.py"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}


class Windows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        window = torch.arange(i, i + 16) % 256
        return {"input_ids": window, "labels": window}


def tiny_trainer(tmp_path: Path, **arguments: object) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                             save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True, **arguments)
    return Trainer(model=model, args=args, train_dataset=Windows())


@pytest.mark.timeout(120)
def test_collaborate_wraps_the_trainers_optimizer_schedule_and_logs(tmp_path):
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=False)]   # no round: batches are counted
    trainer = tiny_trainer(tmp_path, gradient_accumulation_steps=2, max_steps=3,
                           logging_steps=1, learning_rate=1e-3, lr_scheduler_type="linear")
    opt = collaborate(trainer, node=node, run_id="hf-unit", target_batch_size=1024, epochs=10)
    try:
        assert trainer.optimizer is opt and isinstance(opt, p2pdl.Optimizer)
        assert isinstance(opt.optimizer, torch.optim.AdamW)   # the Trainer's own choice
        assert opt.config.batch_size_per_step == 8   # 4 per device x 2 accumulated
        assert isinstance(trainer.lr_scheduler, EpochSchedule)
        assert opt.scheduler is not None   # the linear schedule, over global epochs
        assert isinstance(trainer.callback_handler.callbacks[0], CollaborationCallback)
        trainer.train()
        # 3 Trainer steps of 8 samples, no global step: the lr is where the
        # schedule starts (linear over 10 epochs, no warm-up), and stays there.
        assert opt.samples_accumulated == 24 and opt.local_epoch == 0
        assert trainer.lr_scheduler.get_last_lr() == [1e-3, 1e-3]
        logged = [r for r in trainer.state.log_history if "loss" in r]
        assert len(logged) == 3
        assert logged[-1]["p2pdl_epoch"] == 0 and logged[-1]["p2pdl_target"] == 8
        assert "p2pdl_rounds_averaged" in logged[-1] and "p2pdl_peers" in logged[-1]
        with pytest.raises(ConfigError, match="collaborative already"):
            collaborate(trainer, node=node, run_id="hf-unit", target_batch_size=1024)
    finally:
        opt.close()


@pytest.mark.timeout(60)
def test_collaborate_refuses_what_it_cannot_make_collaborative(tmp_path):
    node = FakeNode()
    node.tracker.view = [fake_progress(0)]
    with pytest.raises(ConfigError, match="takes a transformers.Trainer"):
        collaborate(object(), node=node, run_id="r", target_batch_size=8)
    with pytest.raises(ConfigError, match="epochs must be"):
        collaborate(tiny_trainer(tmp_path), node=node, run_id="r", target_batch_size=8,
                    epochs=0)
    trainer = tiny_trainer(tmp_path)
    inner = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
    trainer.optimizer = inner
    trainer.lr_scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=1)
    with pytest.raises(ConfigError, match="LR scheduler of its own"):
        collaborate(trainer, node=node, run_id="r", target_batch_size=8)
    trainer.lr_scheduler = None   # an optimizer of its own (optimizers=) is wrapped
    opt = collaborate(trainer, node=node, run_id="r", target_batch_size=8, sent_momentum=None)
    assert opt.optimizer is inner
    opt.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_peers_train_a_gpt2_through_the_trainer_and_end_identical(tmp_path):
    epochs = "6"   # (run in tmp_path: the Trainer writes its output_dir there)
    first = subprocess.Popen([sys.executable, str(EXAMPLE), epochs, "0"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        assert line.startswith("peer:"), line + first.stderr.read()[-2000:]
        address = next(a for a in line.split()[1:] if a.startswith("/ip4/127.0.0.1/"))
        second = subprocess.run([sys.executable, str(EXAMPLE), epochs, "1", address],
                                capture_output=True, text=True, env=ENV, timeout=240,
                                cwd=tmp_path)
        rest, errors = first.communicate(timeout=240)
    finally:
        first.kill()
        first.wait(10)
    assert second.returncode == 0, second.stderr[-3000:]
    assert first.returncode == 0, errors[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out in (rest, second.stdout)]
    for result in results:
        stats = result["statistics"]
        assert stats["epoch"] == 6 and stats["averaged"] >= 1, stats
        losses = result["losses"]
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses   # it learns
        assert set(result["logged"]) == {"p2pdl_epoch", "p2pdl_peers", "p2pdl_samples",
                                         "p2pdl_target", "p2pdl_rounds_averaged"}
    # The last round averaged both peers: the same parameters, bit for bit.
    if all(r["last_round"] == "averaged" for r in results):
        assert results[0]["parameters"] == results[1]["parameters"], results
    assert "Traceback" not in second.stderr + errors
