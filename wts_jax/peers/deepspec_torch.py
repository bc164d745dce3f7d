"""DeepSpec's serial-head loop in PyTorch: the peer path DSpark ships, and a test oracle.

Module and parameter names mirror DeepSpec (``markov_head.markov_w1`` is an
``nn.Embedding``, ``markov_w2`` an ``nn.Linear(r, V, bias=False)``, ``gate_proj`` /
``joint_proj`` / ``confidence_head.proj`` are ``nn.Linear`` with inputs concatenated in
DeepSpec's order), and ``sample_block_tokens`` runs DeepSpec's per-step loop:
``Embedding → head step → Linear → add → argmax / softmax + multinomial``, nothing hoisted.

Two precisions: ``dtype=torch.bfloat16`` is what DeepSpec runs (the bias is rounded to
bf16 before the add); ``dtype=torch.float32`` keeps bf16 weights' values but computes in
fp32 — the wts_jax contract — so tokens can be compared exactly.
``gumbel_noise_torch`` re-implements the wts_jax generator with int64 arithmetic, an
independent check of its specification.

torch is imported by this module only; nothing else in wts_jax needs it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

_MASK32 = 0xFFFFFFFF


class DeepSpecMarkovHead(nn.Module):

  def __init__(self, vocab_size: int, rank: int, hidden_size: int, head_type: str):
    super().__init__()
    self.head_type = head_type
    self.rank = rank
    self.markov_w1 = nn.Embedding(vocab_size, rank)
    self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
    if head_type == "gated":
      self.gate_proj = nn.Linear(hidden_size + rank, rank)
    elif head_type == "rnn":
      self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

  def step(self, prev_tokens, hidden_k, state):
    """One walk step: returns (bias [B, V], new state)."""
    e = self.markov_w1(prev_tokens)
    if self.head_type == "vanilla":
      z = e
    elif self.head_type == "gated":
      gate = torch.sigmoid(self.gate_proj(torch.cat([hidden_k, e], dim=-1)))
      z = gate * e
    else:
      gate, candidate, output = self.joint_proj(
          torch.cat([state, e, hidden_k], dim=-1)).chunk(3, dim=-1)
      update = torch.sigmoid(gate)
      state = update * state + (1 - update) * torch.tanh(candidate)
      z = torch.tanh(output)
    return self.markov_w2(z), state, e


class DeepSpecConfidenceHead(nn.Module):

  def __init__(self, hidden_size: int, rank: int, with_markov: bool):
    super().__init__()
    self.with_markov = with_markov
    self.proj = nn.Linear(hidden_size + (rank if with_markov else 0), 1)

  def forward(self, hidden_k, e):
    inputs = torch.cat([hidden_k, e], dim=-1) if self.with_markov else hidden_k
    return self.proj(inputs)[..., 0].float()


class DeepSpecHead(nn.Module):
  """``markov_head`` + optional ``confidence_head``, as in a DSpark drafter."""

  def __init__(self, vocab_size, rank, hidden_size, head_type, confidence=False,
               confidence_with_markov=True):
    super().__init__()
    self.markov_head = DeepSpecMarkovHead(vocab_size, rank, hidden_size, head_type)
    self.confidence_head = (DeepSpecConfidenceHead(hidden_size, rank,
                                                   confidence_with_markov)
                            if confidence else None)


def _to_torch(array) -> torch.Tensor:
  """A JAX/NumPy array (bf16 included) as a float32 torch tensor (exact)."""
  return torch.from_numpy(np.asarray(np.asarray(array).astype(np.float32)))


def from_wts_head(head, dtype=torch.float32, device="cpu") -> DeepSpecHead:
  """A ``DeepSpecHead`` holding exactly the weights of a wts_jax ``DraftHead``."""
  config = head.config
  torch_head = DeepSpecHead(config.vocab_size, config.rank, config.hidden_size,
                            config.head_type, config.confidence,
                            config.confidence_with_markov)
  w2 = head.markov_head.markov_w2
  if hasattr(w2, "scale"):
    raise ValueError("the DeepSpec peer has no quantized W2; dequantize first")
  params = {
      "markov_head.markov_w1.weight": head.markov_head.markov_w1.weight,
      "markov_head.markov_w2.weight": w2.weight,
  }
  for name in ("gate_proj", "joint_proj"):
    if hasattr(head.markov_head, name):
      layer = getattr(head.markov_head, name)
      params[f"markov_head.{name}.weight"] = layer.weight
      params[f"markov_head.{name}.bias"] = layer.bias
  if head.confidence_head is not None:
    params["confidence_head.proj.weight"] = head.confidence_head.proj.weight
    params["confidence_head.proj.bias"] = head.confidence_head.proj.bias
  state = {key: _to_torch(value[...]) for key, value in params.items()}
  torch_head.load_state_dict(state, strict=True)
  return torch_head.to(device=device, dtype=dtype)


def mix32(x: torch.Tensor) -> torch.Tensor:
  """lowbias32 on int64 tensors holding uint32 values."""
  x = x ^ (x >> 16)
  x = (x * 0x21F0AAAD) & _MASK32
  x = x ^ (x >> 15)
  x = (x * 0x735A2D97) & _MASK32
  return x ^ (x >> 15)


def gumbel_noise_torch(seed_words, batch: int, steps: int, vocab: int) -> torch.Tensor:
  """The wts_jax generator's Gumbel noise [B, K, V] (fp32), written independently."""
  seed0, seed1 = (int(w) for w in np.asarray(seed_words, dtype=np.uint64))
  rows = torch.arange(batch, dtype=torch.int64)[:, None]
  step_ids = torch.arange(steps, dtype=torch.int64)[None, :]
  counter = (rows << 16) | step_ids
  stream = mix32((mix32(counter ^ seed0) + seed1) & _MASK32)            # [B, K]
  vocab_ids = torch.arange(vocab, dtype=torch.int64)
  bits = mix32((mix32(vocab_ids ^ stream[..., None]) + stream[..., None]) & _MASK32)
  u = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))
  return -torch.log(-torch.log(u))


@torch.no_grad()
def sample_block_tokens(head: DeepSpecHead, base_logits, first_tokens, hidden=None, *,
                        temperature: float = 0.0, gumbel=None, generator=None):
  """DeepSpec's walk: K steps of embed → head → W2 → add → select, nothing hoisted.

  Selection: argmax at temperature 0; with ``gumbel`` [B, K, V] given,
  ``argmax(logits * (1/T) + gumbel)`` (the wts_jax contract); else DeepSpec's
  ``softmax(logits / T)`` + ``torch.multinomial``. Returns (tokens [B, K] int64,
  confidence [B, K] fp32 or None, logits [B, K, V] fp32).
  """
  markov = head.markov_head
  batch, steps, _ = base_logits.shape
  weight_dtype = markov.markov_w2.weight.dtype
  base_logits = base_logits.to(weight_dtype)
  hidden = None if hidden is None else hidden.to(weight_dtype)
  state = torch.zeros(batch, markov.rank, dtype=weight_dtype, device=base_logits.device)
  prev = first_tokens.long()
  tokens, confidences, all_logits = [], [], []
  for k in range(steps):
    hidden_k = None if hidden is None else hidden[:, k]
    bias, state, e = markov.step(prev, hidden_k, state)
    logits = base_logits[:, k] + bias
    if temperature == 0.0:
      prev = torch.argmax(logits, dim=-1)
    elif gumbel is not None:
      # 1/T in fp32, as the JAX side computes it.
      scale = torch.ones((), dtype=torch.float32) / torch.tensor(temperature,
                                                                 dtype=torch.float32)
      prev = torch.argmax(logits.float() * scale + gumbel[:, k], dim=-1)
    else:
      probs = torch.softmax(logits.float() / temperature, dim=-1)
      prev = torch.multinomial(probs, 1, generator=generator)[:, 0]
    tokens.append(prev)
    all_logits.append(logits.float())
    if head.confidence_head is not None:
      confidences.append(head.confidence_head(hidden_k, e))
  confidence = torch.stack(confidences, 1) if confidences else None
  return torch.stack(tokens, 1), confidence, torch.stack(all_logits, 1)
