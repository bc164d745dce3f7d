"""A float64 NumPy walk written from docs/design.md §1, independent of wts_jax's code.

Same contract as the library, in float64 throughout (the library accumulates in fp32);
ties go to the lowest index.
"""

from __future__ import annotations

import numpy as np


def f64(array) -> np.ndarray:
  return np.asarray(np.asarray(array).astype(np.float32), dtype=np.float64)


def head_arrays(head) -> dict:
  """The head's parameters as float64 NumPy arrays keyed like the checkpoint."""
  markov = head.markov_head
  arrays = {"w1": f64(markov.markov_w1.weight[...]), "w2": f64(markov.markov_w2.weight[...])}
  scale = getattr(markov.markov_w2, "scale", None)
  if scale is not None:
    arrays["w2"] = arrays["w2"] * f64(scale[...])[:, None]  # see vocab_bias below
    arrays["w2_q"] = f64(markov.markov_w2.weight[...])
    arrays["w2_scale"] = f64(scale[...])
  for name in ("gate_proj", "joint_proj"):
    if hasattr(markov, name):
      arrays[name + ".w"] = f64(getattr(markov, name).weight[...])
      arrays[name + ".b"] = f64(getattr(markov, name).bias[...])
  if head.confidence_head is not None:
    arrays["conf.w"] = f64(head.confidence_head.proj.weight[...])[0]
    arrays["conf.b"] = f64(head.confidence_head.proj.bias[...])[0]
  return arrays


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def vocab_bias(arrays, z):
  if "w2_q" in arrays:
    return (z @ arrays["w2_q"].T) * arrays["w2_scale"]
  return z @ arrays["w2"].T


def walk(head, base_logits, first_tokens, hidden=None, *, temperature=0.0, gumbel=None,
         return_all=False):
  """Tokens [B, K] (and confidence, logits) of the walk in float64.

  ``gumbel`` [B, K, V]: the noise to add to ``logits / T`` when sampling.
  """
  config = head.config
  arrays = head_arrays(head)
  r, d = config.rank, config.hidden_size
  base = f64(base_logits)
  h = None if hidden is None else f64(hidden)
  batch, steps, vocab = base.shape
  prev = np.asarray(first_tokens, dtype=np.int64)
  state = np.zeros((batch, r))
  tokens = np.zeros((batch, steps), np.int64)
  confidence = np.zeros((batch, steps))
  logits_all = np.zeros((batch, steps, vocab))
  for k in range(steps):
    e = arrays["w1"][prev]
    if config.head_type == "vanilla":
      z = e
    elif config.head_type == "gated":
      w = arrays["gate_proj.w"]
      gate = sigmoid(h[:, k] @ w[:, :d].T + e @ w[:, d:].T + arrays["gate_proj.b"])
      z = gate * e
    else:
      w = arrays["joint_proj.w"]
      pre = (state @ w[:, :r].T + e @ w[:, r:2 * r].T + h[:, k] @ w[:, 2 * r:].T
             + arrays["joint_proj.b"])
      update = sigmoid(pre[:, :r])
      state = update * state + (1 - update) * np.tanh(pre[:, r:2 * r])
      z = np.tanh(pre[:, 2 * r:])
    logits = base[:, k] + vocab_bias(arrays, z)
    if temperature == 0.0:
      score = logits
    else:
      score = logits * np.float64(np.float32(1.0) / np.float32(temperature)) + gumbel[:, k]
    prev = np.argmax(score, axis=-1)  # first maximum: lowest index
    tokens[:, k] = prev
    logits_all[:, k] = logits
    if config.confidence:
      w_c = arrays["conf.w"]
      c = h[:, k] @ w_c[:d] + arrays["conf.b"]
      if config.confidence_with_markov:
        c = c + e @ w_c[d:]
      confidence[:, k] = c
  if return_all:
    return tokens, (confidence if config.confidence else None), logits_all
  return tokens
