"""The built-in example task: corpus, tokenizer, model, batches, validation, config."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys

import pytest
import torch

from p2pdl.errors import ConfigError
from p2pdl.training import ExampleConfig, ExampleTask, TinyTransformerLM, count_parameters
from p2pdl.training._example import VOCAB_SIZE, BatchStream, decode, encode, load_corpus

pytestmark = pytest.mark.timeout(120)

#: Small enough that the tests take a second or two on a busy CPU.
TINY = ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2, batch_size=8)


@pytest.fixture(scope="module")
def task():
    return ExampleTask(TINY)


def test_corpus_is_the_english_python_documentation():
    text = load_corpus()
    assert 400_000 < len(text) < 600_000
    assert text == load_corpus()  # deterministic order
    for phrase in ("The \"assert\" statement", "exception", "function", "the"):
        assert phrase in text
    words = text.split()
    assert len(words) > 50_000
    assert words.count("the") > 2_000  # English, not code alone


def test_missing_pydoc_data_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # import fails
    with pytest.raises(ConfigError, match="pydoc_data"):
        load_corpus()
    with pytest.raises(ConfigError, match="pydoc_data"):
        ExampleTask(TINY)


def test_tokenizer_round_trip():
    text = load_corpus()[:5000] + "naïve café — ∑ 🐍"
    tokens = encode(text)
    assert tokens.dtype == torch.long and tokens.dim() == 1
    assert int(tokens.min()) >= 0 and int(tokens.max()) < VOCAB_SIZE
    assert len(tokens) == len(text.encode("utf-8"))
    assert decode(tokens) == text
    assert len(encode("")) == 0 and decode(encode("")) == ""
    # A cut multi-byte character decodes to the replacement character, not an error.
    assert decode(encode("é")[:1]) == "\ufffd"


def test_model_is_deterministic_given_the_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    a = TinyTransformerLM(TINY)
    assert torch.equal(torch.rand(4), expected)  # building drew nothing from the global RNG
    b = TinyTransformerLM(TINY)
    c = TinyTransformerLM(dataclasses.replace(TINY, seed=1))
    state_a, state_b, state_c = a.state_dict(), b.state_dict(), c.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not torch.equal(state_a["token_embedding.weight"], state_c["token_embedding.weight"])


def test_output_shapes_causality_and_initial_loss(task):
    model = task.build_model()
    batch = next(task.batches())
    assert batch.shape == (TINY.batch_size, TINY.context_length + 1)
    logits = model(batch[:, :-1])
    assert logits.shape == (TINY.batch_size, TINY.context_length, VOCAB_SIZE)
    # Changing a later token leaves earlier positions' logits alone.
    changed = batch[:, :-1].clone()
    changed[:, 10] = (changed[:, 10] + 1) % VOCAB_SIZE
    assert torch.allclose(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])
    loss = model.loss(batch)
    assert loss.dim() == 0
    assert abs(loss.item() - math.log(VOCAB_SIZE)) < 0.35
    with pytest.raises(ValueError, match="context length"):
        model(torch.zeros(1, TINY.context_length + 1, dtype=torch.long))


def test_default_model_size():
    model = TinyTransformerLM(ExampleConfig())
    assert count_parameters(model) == 445_952
    # The head is tied: no separate 256 x d_model output matrix.
    assert count_parameters(model) == sum(p.numel() for p in model.state_dict().values()
                                          if p.dtype.is_floating_point)


def test_adamw_reduces_the_loss(task):
    torch.manual_seed(0)
    model = task.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = task.validation_loss(model, max_batches=4)
    losses = []
    for batch in itertools.islice(task.batches(peer_index=0), 60):
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] > 5.0
    assert sum(losses[-10:]) / 10 < losses[0] - 1.5
    assert task.validation_loss(model, max_batches=4) < before - 1.5


def test_batches_differ_across_peers_and_repeat_for_the_same_seed(task):
    first = [next(task.batches(peer_index=i)) for i in range(3)]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.equal(first[i], first[j])
    again = task.batches(peer_index=1)
    stream = task.batches(peer_index=1)
    assert all(torch.equal(next(again), next(stream)) for _ in range(5))
    assert stream.batches_drawn == 5
    other_seed = ExampleTask(dataclasses.replace(TINY, seed=1))
    assert not torch.equal(next(other_seed.batches(peer_index=1)), first[1])
    # Every sample is a real window of the training split.
    all_windows = task.train_tokens.unfold(0, TINY.context_length + 1, 1)
    for window in first[0]:
        assert (all_windows == window).all(dim=1).any()


def test_batches_come_from_the_training_split_only():
    text = "a" * 900 + "b" * 100
    task = ExampleTask(dataclasses.replace(TINY, holdout_fraction=0.1), text=text)
    assert len(task.train_tokens) == 900 and len(task.holdout_tokens) == 100
    stream = task.batches(peer_index=2)
    assert all(set(next(stream).flatten().tolist()) == {ord("a")} for _ in range(20))
    windows = task.validation_windows()
    assert len(windows) == 1 and windows[0].shape == ((100 - 1) // 32, 33)
    assert set(windows[0].flatten().tolist()) == {ord("b")}


def test_validation_loss_is_deterministic(task):
    model = task.build_model()
    model.train()
    first = task.validation_loss(model, max_batches=3)
    next(task.batches())  # drawing training batches changes nothing
    assert task.validation_loss(model, max_batches=3) == first
    assert model.training  # mode restored
    assert task.validation_loss(model) != first  # more windows, another mean
    assert len(task.validation_windows(2)) == 2
    with pytest.raises(ConfigError, match="max_batches"):
        task.validation_loss(model, max_batches=0)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("context_length", 0, "context_length must be >= 1"),
    ("d_model", 1.5, "d_model must be an integer"),
    ("n_layers", True, "n_layers must be an integer"),
    ("n_heads", 3, "must divide d_model"),
    ("batch_size", -1, "batch_size must be >= 1"),
    ("seed", -1, "seed must be >= 0"),
    ("seed", 2**63, "below 2\\*\\*63"),
    ("dropout", 1.0, "dropout must be in"),
    ("dropout", float("nan"), "dropout must be a finite number"),
    ("holdout_fraction", 0.0, "holdout_fraction must be in"),
    ("holdout_fraction", 0.6, "holdout_fraction must be in"),
])
def test_bad_config_raises(field, value, message):
    with pytest.raises(ConfigError, match=message):
        ExampleConfig(**{field: value})


def test_corpus_too_short_for_the_config_raises():
    with pytest.raises(ConfigError, match="at least one window"):
        ExampleTask(TINY, text="too short")
    with pytest.raises(ConfigError, match="peer_index"):
        BatchStream(torch.arange(100), context_length=8, batch_size=2, peer_index=-1)
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1"):
        BatchStream(torch.arange(100), context_length=8, batch_size=0)
    with pytest.raises(ConfigError, match="at least 9 tokens"):
        BatchStream(torch.arange(5), context_length=8, batch_size=2)
