"""``generate``'s inputs checked before any work: models that fit together, prompts,
EOS ids. A bad one raises ``ValueError`` naming the value."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wts_jax.specdecode.dspark import DSparkDrafter
from wts_jax.specdecode.policy import DraftPolicy, max_draft_len
from wts_jax.specdecode.qwen3 import Qwen3


def check_models(target: Qwen3, drafter: DSparkDrafter, policy: DraftPolicy) -> None:
  """Refuse a target/drafter/draft-length combination that cannot run together."""
  t, d = target.config, drafter.config
  if t.vocab_size != d.vocab_size:
    raise ValueError(f"drafter vocab_size={d.vocab_size} != target vocab_size="
                     f"{t.vocab_size}: the drafter must draft the target's vocabulary")
  bad = [layer for layer in d.target_layer_ids if not -1 <= layer < t.num_layers]
  if bad:
    raise ValueError(f"drafter target_layer_ids={list(d.target_layer_ids)} has {bad[0]}, "
                     f"beyond the target's {t.num_layers} layers (ids in -1..{t.num_layers - 1})")
  if d.num_target_layers is not None and d.num_target_layers != t.num_layers:
    raise ValueError(f"drafter num_target_layers={d.num_target_layers} != the target's "
                     f"num_layers={t.num_layers}: trained for another target")
  features = drafter.fc.weight.shape[1]
  if features != len(d.target_layer_ids) * t.hidden_size:
    raise ValueError(f"drafter fc takes {features} features, but {len(d.target_layer_ids)} "
                     f"target layers of hidden_size={t.hidden_size} give "
                     f"{len(d.target_layer_ids) * t.hidden_size}")
  if max_draft_len(policy) > d.block_size:
    raise ValueError(f"draft_len={max_draft_len(policy)} must be <= the drafter's "
                     f"block_size={d.block_size}")


def prompt_array(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
    raise ValueError(f"prompts={prompts!r:.80} must be a non-empty list of token-id lists")
  rows = []
  for b, prompt in enumerate(prompts):
    row = np.asarray(prompt)
    if row.ndim != 1 or row.size == 0 or not np.issubdtype(row.dtype, np.integer):
      raise ValueError(f"prompts[{b}] must be a non-empty list of token ids")
    if row.min() < 0 or row.max() >= vocab_size:
      outside = int(row.max() if row.max() >= vocab_size else row.min())
      raise ValueError(f"prompts[{b}] holds id {outside}, outside [0, vocab_size="
                       f"{vocab_size})")
    rows.append(row)
  lengths = np.array([row.size for row in rows], np.int32)
  array = np.zeros((len(rows), int(lengths.max())), np.int32)
  for b, row in enumerate(rows):
    array[b, :row.size] = row
  return array, lengths


def eos_id_array(eos_id, vocab_size: int) -> np.ndarray:
  """``eos_id`` (an int, a sequence of ints, or None) as an int32 array, -1 for none."""
  def as_id(value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise ValueError(f"eos_id={eos_id!r} must be a token id (an int) or a list of them")
    if not 0 <= value < vocab_size:   # such an id would never end a row: a typo, not a wish
      raise ValueError(f"eos_id {value} is outside [0, vocab_size={vocab_size})")
    return int(value)
  if eos_id is None:
    ids = []
  elif isinstance(eos_id, (int, np.integer)):
    ids = [as_id(eos_id)]
  elif isinstance(eos_id, (Sequence, np.ndarray)) and not isinstance(eos_id, (str, bytes)):
    ids = [as_id(value) for value in eos_id]
  else:
    raise ValueError(f"eos_id={eos_id!r} must be a token id (an int) or a list of them")
  # At least one entry (-1 matches no token): no EOS and one EOS share a compile.
  return np.array(ids or [-1], np.int32)
