"""The built-in example task: a small transformer language model on CPython's own docs.

The corpus is the documentation text that ships with every CPython in
``pydoc_data.topics`` (about 465 000 characters of English and code), so the
example needs no downloads.  Tokens are the corpus's UTF-8 bytes (vocabulary 256).
The model is a GPT-style decoder: token and learned position embeddings,
``n_layers`` pre-LayerNorm blocks with causal self-attention, a final LayerNorm
and an output head tied to the token embedding.  Its initial parameters depend
only on ``ExampleConfig.seed``, so every peer that builds it starts from the same
point; each peer draws its own batches from the training split
(``peer_index``), and all peers measure the same fixed held-out windows.

This module uses torch and the standard library only: it knows nothing of the
network, and a plain torch loop trains it::

    import itertools

    import torch
    from p2pdl.training._example import ExampleConfig, ExampleTask

    task = ExampleTask(ExampleConfig())           # loads and splits the corpus
    model = task.build_model()                    # same parameters for every peer
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for batch in itertools.islice(task.batches(peer_index=0), 1000):
        loss = model.loss(batch)                  # next-token cross-entropy, nats
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(task.validation_loss(model))            # ~1.4 after these 1000 steps

Measured on this project's 2-core machine kind (x86-64, torch 2.13 CPU, one
thread: ``torch.set_num_threads(1)``), default config, batch 16 × 128 tokens,
445 952 parameters (``count_parameters``):

* a training step (forward, backward, AdamW) takes ~115 ms: ~8.5 steps/s,
  ~135 samples/s, ~17 000 tokens/s per core.  Forward alone is ~52 ms;
  matrix products take ~80 % of the time, at ~55 GFLOP/s (a plain 2048 × 512
  matmul reaches ~88 on one core), so only a smaller model would be faster.
* the loop above (AdamW, lr 1e-3, constant) lowers the training loss
  (moving average over ~10 steps) from 5.47 (ln 256 = 5.55) to 2.72 after
  100 steps (13 s), 2.40 after 300 (36 s), 1.96 after 600 (68 s) and 1.51
  after 1000 (112 s); the validation loss is then 1.42.  lr 3e-3 is slower
  here (3.09, 2.57, 2.26, 1.65; validation 1.51), lr 1e-2 slower still
  (3.16 at 100 steps, 2.88 at 300).
* with batch 128 (e.g. a small DeDLOC global batch) and lr 1e-3: 3.26 after
  30 steps, 2.79 after 50, 2.48 after 100 (12 800 samples, 85 s); validation
  2.15 (lr 3e-3: 2.74 after 100, validation 2.35).

Two cores thus compute ~270 samples/s: three minutes are ~48 000 samples,
3000 steps of batch 16 or 375 of a global batch of 128, before any cost of
averaging.  Fewer, larger steps learn less per sample, so a demo that must show
the loss falling should keep its global batch small (~128).  The machine was
shared with other jobs during these runs; treat the times as ±20 %.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

__all__ = [
    "VOCAB_SIZE",
    "load_corpus",
    "encode",
    "decode",
    "ExampleConfig",
    "TinyTransformerLM",
    "count_parameters",
    "BatchStream",
    "ExampleTask",
]

#: Byte-level tokens: one per byte value.
VOCAB_SIZE = 256

#: Standard deviation of the initial embeddings and linear weights (as GPT-2).
_INIT_STD = 0.02


def load_corpus() -> str:
    """Return the documentation text that ships with CPython, about 465 000 characters.

    The values of ``pydoc_data.topics.topics`` joined by newlines in the order
    of their sorted keys, so the text is the same on every run of one Python
    version (it differs slightly between versions: every peer of a run should
    use the same one, or at least accept that their data differ a little).

    Raises:
        ConfigError: this Python has no ``pydoc_data`` (some minimal or
            repackaged Pythons leave it out).
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:
        raise ConfigError(
            "the example task needs the 'pydoc_data' module of the standard library "
            "(the text of the Python documentation); this Python has none. Install the "
            "full standard library (a python.org or distribution build has it) "
            "or bring your own training task") from exc
    return "\n".join(topics[key] for key in sorted(topics))


def encode(text: str) -> torch.Tensor:
    """Return the tokens of ``text``: its UTF-8 bytes as a 1-D int64 tensor."""
    data = bytearray(text.encode("utf-8"))
    if not data:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(data, dtype=torch.uint8).long()


def decode(tokens: torch.Tensor) -> str:
    """Return the text of byte tokens; bytes that are not valid UTF-8 become U+FFFD.

    A model's samples may cut a multi-byte character, hence the replacement.
    """
    return bytes(tokens.reshape(-1).to(torch.uint8).tolist()).decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
    """The example task's model, data and sampling settings.

    Attributes:
        context_length: tokens (bytes) the model sees at once; each sample is a
            window of ``context_length + 1`` tokens (inputs plus shifted
            targets).  Default 128.
        d_model: width of the embeddings and of the residual stream.
            Default 128.
        n_layers: transformer blocks.  Default 2.
        n_heads: attention heads per block; must divide ``d_model``.  Default 4.
        mlp_ratio: hidden width of each block's MLP as a multiple of
            ``d_model``.  Default 4.
        dropout: dropout probability on attention and residual branches, in
            [0, 1).  Default 0.0: the runs are short and the corpus is read
            only a few times, and without dropout a training step of a given
            batch is deterministic.
        batch_size: samples per batch of ``ExampleTask.batches`` and per
            forward pass of ``ExampleTask.validation_loss``.  Default 16.
        seed: seeds the initial parameters (the same for every peer) and,
            with the peer index, each peer's batch sampling.  Default 0.
        holdout_fraction: the last this-fraction of the corpus is held out for
            validation and never sampled for training, in (0, 0.5].
            Default 0.05 (about 23 000 bytes: 182 windows of 128 tokens).
    """

    context_length: int = 128
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    batch_size: int = 16
    seed: int = 0
    holdout_fraction: float = 0.05

    def __post_init__(self) -> None:
        for name in ("context_length", "d_model", "n_layers", "n_heads", "mlp_ratio",
                     "batch_size", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"ExampleConfig.{name} must be an integer, got {value!r}")
            least = 0 if name == "seed" else 1
            if value < least:
                raise ConfigError(f"ExampleConfig.{name} must be >= {least}, got {value!r}")
        if self.seed >= 2**63:
            raise ConfigError(f"ExampleConfig.seed must be below 2**63, got {self.seed!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"ExampleConfig.n_heads ({self.n_heads}) must divide "
                              f"d_model ({self.d_model})")
        for name, low, high, high_open in (("dropout", 0.0, 1.0, True),
                                           ("holdout_fraction", 0.0, 0.5, False)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ConfigError(f"ExampleConfig.{name} must be a finite number, "
                                  f"got {value!r}")
            too_high = value >= high if high_open else value > high
            if value < low or too_high or (name == "holdout_fraction" and value == 0):
                interval = f"[{low}, {high})" if high_open else f"({low}, {high}]"
                raise ConfigError(f"ExampleConfig.{name} must be in {interval}, got {value!r}")


class _Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.dropout = config.dropout
        self.ln_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, config.mlp_ratio * d)
        self.mlp_out = nn.Linear(config.mlp_ratio * d, d)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_attn(x)).split(d, dim=2)
        # (B, T, D) -> (B, heads, T, D / heads)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.attn_out(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp_out(F.gelu(self.mlp_in(self.ln_mlp(x)))))


class TinyTransformerLM(nn.Module):
    """A small GPT-style byte-level language model.

    Its parameters right after construction depend only on ``config.seed``
    (a private generator draws them; the CPU state of the global torch RNG is
    left as it was), so peers that build it from the same config hold
    identical parameters.  Linear weights and embeddings are N(0, 0.02²), residual
    output projections N(0, (0.02 / sqrt(2 · n_layers))²) as GPT-2, biases 0,
    LayerNorms the identity.  The initial loss is within ~0.3 of ln 256
    (5.47 on training batches of the default config, 5.29 on the held-out
    windows: with the tied head, a token's logit for repeating itself starts
    slightly high, and the held-out text repeats spaces often).
    """

    def __init__(self, config: ExampleConfig) -> None:
        super().__init__()
        self.config = config
        # torch's default initialisation draws from the global RNG; its state
        # is restored, and reset_parameters sets the real values.  (Building
        # on the meta device instead would avoid the draws, but its first use
        # costs over a second of lazy imports.)
        with torch.random.fork_rng(devices=[]):
            self.token_embedding = nn.Embedding(VOCAB_SIZE, config.d_model)
            self.position_embedding = nn.Embedding(config.context_length, config.d_model)
            self.drop = nn.Dropout(config.dropout)
            self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
            self.ln_final = nn.LayerNorm(config.d_model)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Set every parameter to its seeded initial value (see the class docstring)."""
        generator = torch.Generator().manual_seed(self.config.seed)
        residual_std = _INIT_STD / math.sqrt(2 * self.config.n_layers)
        # named_modules() has a fixed order, so the draws are reproducible.
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn_out", "mlp_out")) else _INIT_STD
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return next-token logits, shape (B, T, 256), for int64 tokens of shape (B, T).

        Position t's logits depend on tokens 0..t only.

        Raises:
            ValueError: ``tokens`` is not 2-D or T exceeds ``config.context_length``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, time), got {tuple(tokens.shape)}")
        t = tokens.shape[1]
        if t > self.config.context_length:
            raise ValueError(f"sequence of {t} tokens exceeds the context length "
                             f"{self.config.context_length}")
        positions = torch.arange(t, device=tokens.device)
        x = self.drop(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        # The output head is tied to the token embedding.
        return F.linear(self.ln_final(x), self.token_embedding.weight)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return the mean next-token cross-entropy (nats) of windows of shape (B, T + 1).

        Inputs are ``tokens[:, :-1]``, targets ``tokens[:, 1:]``; T may be at
        most ``config.context_length``.
        """
        logits = self.forward(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))


def count_parameters(model: nn.Module) -> int:
    """Return the number of scalar parameters of ``model``, a tied weight counted once.

    445 952 for ``TinyTransformerLM(ExampleConfig())``.
    """
    return sum(p.numel() for p in model.parameters())


def _stream_seed(seed: int, peer_index: int) -> int:
    # A hash, not seed + peer_index, so that (seed 0, peer 1) and (seed 1,
    # peer 0) do not share a stream.
    digest = hashlib.blake2b(f"p2pdl-example/{seed}/{peer_index}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # torch seeds are below 2**63


class BatchStream(Iterator[torch.Tensor]):
    """An endless iterator of training batches of shape (batch_size, context_length + 1).

    Each sample is a window of ``context_length + 1`` consecutive tokens that
    starts at an offset drawn uniformly from ``tokens`` (with replacement).
    The draws come from a private generator seeded by ``(seed, peer_index)``:
    the same pair yields the same batches in the same order in any process,
    and different peer indices yield different batches.  The global torch RNG
    is neither read nor advanced.

    Attributes:
        batches_drawn: batches returned so far.
    """

    def __init__(self, tokens: torch.Tensor, *, context_length: int, batch_size: int,
                 seed: int = 0, peer_index: int = 0) -> None:
        """Sample from the 1-D int64 ``tokens``.

        Raises:
            ConfigError: ``context_length`` or ``batch_size`` is not an
                integer >= 1, ``seed`` or ``peer_index`` not one >= 0, or
                ``tokens`` is not 1-D or shorter than one window.
        """
        for name, value, least in (("context_length", context_length, 1),
                                   ("batch_size", batch_size, 1),
                                   ("seed", seed, 0), ("peer_index", peer_index, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")
        if tokens.dim() != 1 or tokens.numel() < context_length + 1:
            raise ConfigError(f"need a 1-D tensor of at least {context_length + 1} tokens "
                              f"to draw windows from, got shape {tuple(tokens.shape)}")
        self._tokens = tokens
        self._window = torch.arange(context_length + 1)
        self._batch_size = batch_size
        self._generator = torch.Generator().manual_seed(_stream_seed(seed, peer_index))
        self.batches_drawn = 0

    def __next__(self) -> torch.Tensor:
        high = self._tokens.numel() - self._window.numel() + 1
        offsets = torch.randint(high, (self._batch_size,), generator=self._generator)
        self.batches_drawn += 1
        return self._tokens[offsets[:, None] + self._window]


class ExampleTask:
    """The corpus split for one ``ExampleConfig``, and what a training peer needs of it.

    It is a task of ``p2pdl train --task`` (``p2pdl.training:ExampleTask``,
    what ``p2pdl train`` runs without one): ``batch_size``, ``build_model``,
    ``batches``, ``loss`` and ``validation_loss``.

    Attributes:
        config: the settings.
        train_tokens: the first ``1 - holdout_fraction`` of the corpus's bytes.
        holdout_tokens: the rest, for ``validation_loss`` only.
    """

    def __init__(self, config: ExampleConfig | None = None, *, text: str | None = None) -> None:
        """Load (``load_corpus()`` unless ``text`` is given), encode and split the corpus.

        Raises:
            ConfigError: ``pydoc_data`` is missing, or either split is shorter
                than one window of ``context_length + 1`` tokens.
        """
        self.config = config if config is not None else ExampleConfig()
        tokens = encode(load_corpus() if text is None else text)
        n_holdout = int(len(tokens) * self.config.holdout_fraction)
        self.train_tokens = tokens[:len(tokens) - n_holdout]
        self.holdout_tokens = tokens[len(tokens) - n_holdout:]
        window = self.config.context_length + 1
        if len(self.train_tokens) < window or len(self.holdout_tokens) < window:
            raise ConfigError(
                f"the corpus ({len(tokens)} bytes) split at holdout_fraction "
                f"{self.config.holdout_fraction} leaves {len(self.train_tokens)} training and "
                f"{len(self.holdout_tokens)} held-out bytes; each needs at least one window "
                f"of context_length + 1 = {window}")

    @property
    def batch_size(self) -> int:
        """Samples per batch (``config.batch_size``)."""
        return self.config.batch_size

    def build_model(self) -> TinyTransformerLM:
        """Return a new model with the seeded initial parameters."""
        return TinyTransformerLM(self.config)

    def loss(self, model: TinyTransformerLM, batch: torch.Tensor) -> torch.Tensor:
        """The model's mean next-token loss on ``batch`` (``model.loss``)."""
        return model.loss(batch)

    def batches(self, peer_index: int = 0) -> BatchStream:
        """Return peer ``peer_index``'s endless stream of training batches.

        Each batch is ``config.batch_size`` samples; pass it to ``model.loss``.
        """
        return BatchStream(self.train_tokens, context_length=self.config.context_length,
                           batch_size=self.config.batch_size, seed=self.config.seed,
                           peer_index=peer_index)

    def validation_windows(self, max_batches: int | None = None) -> list[torch.Tensor]:
        """Return the fixed held-out batches: consecutive windows, one token overlapping.

        Window i covers held-out tokens ``[i·T, (i+1)·T]`` (T = context_length),
        so every held-out token but the first is a target exactly once; the
        windows are grouped into batches of ``config.batch_size`` (the last may
        be smaller), at most ``max_batches`` of them (None: all).
        """
        t = self.config.context_length
        n_windows = (len(self.holdout_tokens) - 1) // t
        starts = torch.arange(n_windows) * t
        windows = self.holdout_tokens[starts[:, None] + torch.arange(t + 1)]
        batches = list(windows.split(self.config.batch_size))
        return batches if max_batches is None else batches[:max_batches]

    def validation_loss(self, model: nn.Module, max_batches: int | None = None) -> float:
        """Return the model's mean next-token loss (nats) over the fixed held-out windows.

        Deterministic for given parameters: the windows never change, and the
        model runs in eval mode (no dropout) without gradients; its training
        mode is restored afterwards.

        Raises:
            ConfigError: ``max_batches`` is not None or an integer >= 1.
        """
        if max_batches is not None and (isinstance(max_batches, bool)
                                        or not isinstance(max_batches, int) or max_batches < 1):
            raise ConfigError(f"max_batches must be None or an integer >= 1, "
                              f"got {max_batches!r}")
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            with torch.no_grad():
                for batch in self.validation_windows(max_batches):
                    targets = batch[:, 1:].numel()
                    total += float(model.loss(batch)) * targets
                    count += targets
        finally:
            model.train(was_training)
        return total / count
