"""Small seeded models and data shared by the ZeRO tests and the ZeRO benchmark.

``TinyLM`` is a GPT-style decoder (token + position embeddings, pre-norm blocks of causal
self-attention and an MLP, a final LayerNorm and a head tied to the token embedding); ``MLP`` a
plain stack of Linear + GELU.  Both are built from a seed alone, so every rank of a test builds the
same weights without communicating, and the batches are functions of (seed, rank, step, micro-step),
so a reference run and a ZeRO run see the same data.

Sizes: ``TinyLM()`` has about 30 K parameters (tests); ``TinyLM.benchmark_size()`` about 10 M.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LMShape:
    vocab: int = 64
    """Vocabulary size (tokens are ints in ``[0, vocab)``)."""
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    seq_len: int = 16
    """Longest sequence the position embedding covers."""
    tie_weights: bool = True
    """The output head shares the token embedding's weight (a tied parameter)."""


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        # No qkv bias: the key bias has a zero gradient (softmax ignores a per-query constant), and Adam
        # turns the rounding noise it gets instead into O(lr) steps that differ between reduction orders.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=-1)
        heads = lambda t: t.view(batch, seq, self.n_heads, dim // self.n_heads).transpose(1, 2)  # noqa: E731
        attn = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """Decoder-only LM: ``forward(tokens (B, T) int64) -> logits (B, T, vocab)``."""

    def __init__(self, shape: LMShape = LMShape()):
        super().__init__()
        self.shape = shape
        self.tok = nn.Embedding(shape.vocab, shape.d_model)
        self.pos = nn.Embedding(shape.seq_len, shape.d_model)
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.n_heads) for _ in range(shape.n_layers))
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)
        for module in self.modules():  # GPT-2's initialization keeps the first losses near log(vocab)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if shape.tie_weights:
            self.head.weight = self.tok.weight

    @staticmethod
    def benchmark_size() -> LMShape:
        """About 10 M parameters: the size the reference measurements used."""
        return LMShape(vocab=8192, d_model=256, n_heads=8, n_layers=8, seq_len=128)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class MLP(nn.Module):
    """``forward(x (B, sizes[0])) -> (B, sizes[-1])``: Linear layers with GELU between them."""

    def __init__(self, sizes=(16, 64, 64, 8)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = F.gelu(x)
        return x


def build_model(name: str, seed: int = 0, **shape) -> nn.Module:
    """``"lm"`` (TinyLM, ``shape`` = LMShape fields) or ``"mlp"``, with weights from ``seed`` alone."""
    torch.manual_seed(seed)
    if name == "lm":
        return TinyLM(LMShape(**shape))
    if name == "mlp":
        return MLP(**shape)
    raise ValueError(f"build_model: unknown model {name!r}; expected 'lm' or 'mlp'")


def batch_for(model: nn.Module, *, seed: int, rank: int, step: int, micro: int = 0,
              batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) for one micro-batch, a function of (seed, rank, step, micro) only."""
    generator = torch.Generator().manual_seed(((seed * 1009 + rank) * 100_003 + step) * 101 + micro)
    if isinstance(model, TinyLM):
        shape = model.shape
        tokens = torch.randint(0, shape.vocab, (batch_size, shape.seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    if isinstance(model, MLP):
        first, last = model.layers[0].in_features, model.layers[-1].out_features
        x = torch.randn(batch_size, first, generator=generator)
        return x, torch.randn(batch_size, last, generator=generator)
    raise TypeError(f"batch_for: no data recipe for {type(model).__name__}")


def loss_fn(model: nn.Module, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy over the vocabulary for TinyLM, mean squared error for MLP (float32 either way)."""
    if isinstance(model, TinyLM):
        return F.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.mse_loss(output.float(), target.float())


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters' elements (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())

