"""p2pdl.training._checkpoint: atomic save, rotation, verified load with fallback, policy."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import stat
from pathlib import Path

import pytest
import torch

from p2pdl import CheckpointError
from p2pdl.errors import ConfigError, P2PDLError
from p2pdl.training import _checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from p2pdl.training._checkpoint import MAX_KEEP, CheckpointPolicy

pytestmark = pytest.mark.timeout(60)


def small_state(epoch: int) -> dict:
    return {"model": {"weight": torch.full((4,), float(epoch))}, "epoch": epoch}


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def pair(epoch: int) -> list[str]:
    return [f"checkpoint-{epoch:010d}.json", f"checkpoint-{epoch:010d}.pt"]


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train_step(model, optimizer, scheduler, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, generator=generator), torch.randn(16, 2, generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    scheduler.step()


def test_round_trip_of_model_adamw_and_scheduler_resumes_the_same_training(tmp_path):
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for seed in range(3):
        train_step(model, optimizer, scheduler, seed)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "epoch": 3, "run_id": "run-a",
             "meta": {"samples": 4096, "loss": 0.25, "tags": ["x", "y"], "digest": b"\x00\x01"}}
    path = save_checkpoint(tmp_path / "ckpt", state, 3)
    assert path == tmp_path / "ckpt" / "checkpoint-0000000003.pt"

    loaded, epoch = load_checkpoint(tmp_path / "ckpt")
    assert epoch == 3
    assert loaded["run_id"] == "run-a" and loaded["meta"] == state["meta"]
    model2 = make_model()
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler2 = torch.optim.lr_scheduler.StepLR(optimizer2, step_size=2, gamma=0.5)
    model2.load_state_dict(loaded["model"])
    optimizer2.load_state_dict(loaded["optimizer"])
    scheduler2.load_state_dict(loaded["scheduler"])
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)

    train_step(model, optimizer, scheduler, 99)
    train_step(model2, optimizer2, scheduler2, 99)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert optimizer.param_groups[0]["lr"] == optimizer2.param_groups[0]["lr"]


def test_the_file_is_plain_torch_and_the_record_describes_it(tmp_path):
    path = save_checkpoint(tmp_path, small_state(7), 7)
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["format"] == 1 and record["epoch"] == 7
    assert record["size"] == path.stat().st_size
    plain = torch.load(path, weights_only=True)
    assert torch.equal(plain["model"]["weight"], torch.full((4,), 7.0))
    info = latest_checkpoint(tmp_path)
    assert (info.path, info.epoch, info.size, info.sha256) == (path, 7, record["size"],
                                                               record["sha256"])


def test_every_allowed_kind_of_value_loads_back_with_weights_only(tmp_path):
    state = {"none": None, "bool": True, "int": 2**70, "float": float("inf"), "str": "é",
             "bytes": b"\xff", "tuple": (1, (2.5, "x")), "list": [[], {}],
             "ordered": collections.OrderedDict(a=1), "int keys": {0: "a", 1: "b"},
             "tensor": torch.arange(3), "parameter": torch.nn.Parameter(torch.ones(2)),
             "size": torch.Size([2, 3]), "dtype": torch.bfloat16, "device": torch.device("cpu")}
    save_checkpoint(tmp_path, state, 1)
    loaded, _ = load_checkpoint(tmp_path)
    assert loaded.keys() == state.keys()
    assert loaded["size"] == torch.Size([2, 3]) and loaded["dtype"] is torch.bfloat16
    assert loaded["int"] == 2**70 and loaded["tuple"] == (1, (2.5, "x"))


@pytest.mark.parametrize("bad, where", [
    ({"path": Path("/tmp")}, "state['path']"),
    ({"fn": lambda: 0}, "state['fn']"),
    ({"d": collections.defaultdict(int)}, "state['d']"),
    ({"nested": {"s": {1, 2}}}, "state['nested']['s']"),
    ({"keys": {Path("k"): 1}}, "state['keys'] key"),
])
def test_a_state_that_could_not_be_loaded_back_is_refused_before_writing(tmp_path, bad, where):
    with pytest.raises(ConfigError, match=f"^{where.replace('[', '.').replace(']', '.')}"):
        save_checkpoint(tmp_path, bad, 1)
    assert not (tmp_path / "checkpoint-0000000001.pt").exists()


def test_a_cyclic_or_non_dict_state_is_refused(tmp_path):
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(ConfigError, match="nested"):
        save_checkpoint(tmp_path, cyclic, 1)
    with pytest.raises(ConfigError, match="must be a dict"):
        save_checkpoint(tmp_path, [torch.ones(1)], 1)


@pytest.mark.parametrize("kwargs", [{"epoch": -1}, {"epoch": 10**10}, {"epoch": True},
                                    {"epoch": 1.0}, {"keep": 0}, {"keep": MAX_KEEP + 1}])
def test_bad_epoch_and_keep_are_config_errors(tmp_path, kwargs):
    args = {"epoch": 1, "keep": 3} | kwargs
    with pytest.raises(ConfigError):
        save_checkpoint(tmp_path, small_state(1), args["epoch"], keep=args["keep"])
    assert names(tmp_path) == []


def test_rotation_keeps_the_newest_keep(tmp_path):
    for epoch in range(1, 6):
        save_checkpoint(tmp_path, small_state(epoch), epoch, keep=2)
    assert names(tmp_path) == pair(4) + pair(5)
    save_checkpoint(tmp_path, small_state(6), 6, keep=1)
    assert names(tmp_path) == pair(6)


def test_an_older_epoch_just_saved_is_kept(tmp_path, caplog):
    save_checkpoint(tmp_path, small_state(20), 20, keep=1)
    with caplog.at_level(logging.WARNING):
        save_checkpoint(tmp_path, small_state(5), 5, keep=1)
    assert names(tmp_path) == pair(5) + pair(20)
    assert "newer than the epoch 5" in caplog.text


def test_saving_an_epoch_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, small_state(1), 3)
    save_checkpoint(tmp_path, small_state(2), 3)
    state, epoch = load_checkpoint(tmp_path)
    assert epoch == 3 and torch.equal(state["model"]["weight"], torch.full((4,), 2.0))
    assert names(tmp_path) == pair(3)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize("damage", [flip_a_byte, truncate])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog, damage):
    save_checkpoint(tmp_path, small_state(1), 1)
    newest = save_checkpoint(tmp_path, small_state(2), 2)
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="p2pdl.training._checkpoint"):
        state, epoch = load_checkpoint(tmp_path)
    assert epoch == 1 and torch.equal(state["model"]["weight"], torch.ones(4))
    assert "checkpoint-0000000002.pt" in caplog.text
    assert ("torn" if damage is truncate else "SHA-256") in caplog.text
    with pytest.raises(CheckpointError, match="torn" if damage is truncate else "SHA-256"):
        load_checkpoint(newest)
    # Names and sizes only: a torn file is skipped, a same-size corruption is not seen.
    assert latest_checkpoint(tmp_path).epoch == (1 if damage is truncate else 2)


def test_a_corrupt_or_missing_record_is_detected(tmp_path):
    save_checkpoint(tmp_path, small_state(1), 1)
    path = save_checkpoint(tmp_path, small_state(2), 2)
    path.with_suffix(".json").write_text("{not json")
    assert load_checkpoint(tmp_path)[1] == 1
    with pytest.raises(CheckpointError, match="record .* is corrupt"):
        load_checkpoint(path)
    path.with_suffix(".json").write_text(json.dumps({"format": 1, "epoch": 9, "size": 1,
                                                     "sha256": "0" * 64}))
    assert latest_checkpoint(tmp_path).epoch == 1  # record disagrees with its name
    path.with_suffix(".json").unlink()
    with pytest.raises(CheckpointError, match="cannot read checkpoint record"):
        load_checkpoint(path)
    assert latest_checkpoint(tmp_path).epoch == 1


def test_nothing_valid_is_an_error_that_lists_why(tmp_path):
    for epoch in (1, 2):
        truncate(save_checkpoint(tmp_path, small_state(epoch), epoch))
    with pytest.raises(CheckpointError, match="no valid checkpoint.*0002.*0001"):
        load_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path) is None


def test_empty_or_missing_directory(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(CheckpointError, match="there are none"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "missing")
    assert issubclass(CheckpointError, P2PDLError)


def test_a_file_that_is_not_a_checkpoint_is_an_error(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(other)


def test_a_pickle_weights_only_rejects_is_a_checkpoint_error(tmp_path):
    # Written by something other than save_checkpoint, with a valid record.
    path = tmp_path / "checkpoint-0000000001.pt"
    torch.save({"path": Path("/x")}, path)
    data = path.read_bytes()
    path.with_suffix(".json").write_text(json.dumps({
        "format": 1, "epoch": 1, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    with pytest.raises(CheckpointError, match="cannot load"):
        load_checkpoint(path)


def test_the_directory_is_created(tmp_path):
    directory = tmp_path / "a" / "b" / "c"
    save_checkpoint(directory, small_state(1), 1)
    assert names(directory) == pair(1)


def fail_nth_replace(monkeypatch, n: int) -> None:
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == n:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def fail_torch_save(monkeypatch) -> None:
    def save(obj, f):
        f.write(b"partial")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", save)


def fail_nth_directory_fsync(monkeypatch, n: int) -> None:
    real_fsync, calls = _checkpoint._fsync_directory, []

    def fsync_directory(directory):
        calls.append(directory)
        if len(calls) == n:
            raise OSError(5, "Input/output error")
        real_fsync(directory)

    monkeypatch.setattr(_checkpoint, "_fsync_directory", fsync_directory)


@pytest.mark.parametrize("crash", [
    fail_torch_save,
    lambda mp: fail_nth_replace(mp, 1),  # renaming the payload
    lambda mp: fail_nth_replace(mp, 2),  # renaming the commit record
    lambda mp: fail_nth_directory_fsync(mp, 2),  # making the record durable
], ids=["torch.save", "payload rename", "record rename", "record directory fsync"])
def test_a_failed_save_leaves_no_trace_and_the_previous_checkpoint_intact(
        tmp_path, monkeypatch, crash):
    save_checkpoint(tmp_path, small_state(1), 1)
    before = {name: (tmp_path / name).read_bytes() for name in names(tmp_path)}
    crash(monkeypatch)
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        save_checkpoint(tmp_path, small_state(2), 2)
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in names(tmp_path)} == before
    assert load_checkpoint(tmp_path)[1] == 1


def test_writes_are_ordered_fsync_rename_directory_fsync_payload_first(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename {Path(dst).suffix}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path, small_state(1), 1)
    assert events == ["fsync file", "rename .pt", "fsync dir",
                      "fsync file", "rename .json", "fsync dir"]


def test_an_interrupted_save_cleans_up_and_is_not_wrapped(tmp_path, monkeypatch):
    def save(obj, f):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, small_state(1), 1)
    assert names(tmp_path) == []


def test_crash_leftovers_are_ignored_and_removed_by_the_next_save(tmp_path):
    save_checkpoint(tmp_path, small_state(1), 1)
    (tmp_path / ".checkpoint-0000000002.pt.abc123.tmp").write_bytes(b"half a checkp")
    (tmp_path / "checkpoint-0000000003.pt").write_bytes(b"renamed, record never written")
    (tmp_path / "checkpoint-0000000004.json").write_text("{}")  # record without payload
    (tmp_path / "unrelated.txt").write_text("left alone")
    assert latest_checkpoint(tmp_path).epoch == 1
    assert load_checkpoint(tmp_path)[1] == 1
    save_checkpoint(tmp_path, small_state(2), 2)
    assert names(tmp_path) == pair(1) + pair(2) + ["unrelated.txt"]


def test_policy_validation():
    policy = CheckpointPolicy("ckpt")
    assert policy.directory == Path("ckpt") and (policy.every_epochs, policy.keep) == (10, 3)
    for kwargs in [{"every_epochs": 0}, {"every_epochs": 2.5}, {"keep": 0},
                   {"keep": MAX_KEEP + 1}, {"keep": True}, {"directory": None}]:
        with pytest.raises(ConfigError):
            CheckpointPolicy(**({"directory": "ckpt"} | kwargs))
    with pytest.raises(AttributeError):
        policy.keep = 5


def test_policy_due():
    policy = CheckpointPolicy("ckpt", every_epochs=10)
    assert [e for e in range(0, 31) if policy.due(e)] == [10, 20, 30]
    assert CheckpointPolicy("ckpt", every_epochs=1).due(1)
    assert not CheckpointPolicy("ckpt", every_epochs=1).due(0)
    # A peer that caught up from 9 to 12 still saves; one already saved at 10 does not.
    assert policy.due(12, last_saved=9)
    assert not policy.due(12, last_saved=10)
    assert not policy.due(9, last_saved=0)
    assert not policy.due(5, last_saved=20)  # the epoch went backwards
    with pytest.raises(ConfigError):
        policy.due(-1)
    with pytest.raises(ConfigError):
        policy.due(5, last_saved=-1)


def test_module_exports():
    for name in _checkpoint.__all__:
        assert hasattr(_checkpoint, name)
