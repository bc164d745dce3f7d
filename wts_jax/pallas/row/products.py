"""The row kernel's arithmetic on one chunk: W·z of its 64 W2 rows for every batch row
(a register GEMV, or WGMMAs against z's W1 rows), the base logits added, and the greedy
or Gumbel scores folded into per-lane candidates."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.int8_state import LO_STEPS
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS
from wts_jax.pallas.row.spec import RowSpec


def chunk_scores(spec: RowSpec, logits, rows, stream, score_scale, noise_on):
  """Greedy: the logits. Sampling: logits · (1/T) + Gumbel noise (when the row samples)."""
  if spec.greedy:
    return logits
  noise = sampling.gumbel_from_uniform(sampling.uniform_from_stream(stream, rows))
  return logits * score_scale + jnp.where(noise_on, noise, 0.0)


def register_products(weights, z_rows):
  """W·z_b of a chunk as an fp32 GEMV in registers: ``b -> [64]`` (row layout).
  (An int8 chunk converted through bf16 — Mosaic's prmt path — measured slower than
  int8 -> fp32 directly.)"""
  w = weights.astype(jnp.float32)
  return lambda b: (w * z_rows[b]).sum(axis=1)


def wgmma_products(operands, z_s, columns, plane_scales=None):
  """W·z_b of a group of chunks on the tensor cores: per chunk one WGMMA [64, r] x
  [r, 8B] (bf16 operands: a shared-memory slot, or an int8 chunk upcast in registers;
  fp32 accumulation) against ``z_s``, whose 8-row tile b holds W1 rows around token b;
  ``columns[b]`` is the column of token b's own row. All the group's WGMMAs are issued
  before the one wait, so their latencies overlap (a single m64n8 WGMMA is 16 dependent
  k-steps: latency-bound). The column is picked by a masked sum along the row
  (exact: the other terms are zeros). Per chunk ``b -> [64]`` (row layout).

  With ``plane_scales`` (int8 W2, z as two int8 planes: ``wts_jax.int8_state``) the
  operands are int8, the products s32, the tile holds W1's interleaved planes, and
  ``columns[b]`` is token b's q_hi column (q_lo beside it): the masked sum forms
  ``D = 256 · d_hi + d_lo`` in int32 (exact), then ``f32(D) · s_lo``."""
  width = z_s.shape[0]
  planes = plane_scales is not None
  acc_dtype = jnp.int32 if planes else jnp.float32

  def accumulate(*acc_refs):
    for acc_ref, weights in zip(acc_refs, operands):
      plgpu.wgmma(acc_ref, weights, z_s.T)
    return [acc_ref[...] for acc_ref in acc_refs]   # the first read waits for all

  accs = pl.run_scoped(accumulate,
                       *[plgpu.ACC((CHUNK_ROWS, width), acc_dtype)] * len(operands))
  column = plgpu.broadcasted_iota(jnp.int32, (CHUNK_ROWS, width), 1, layout=gpu.WGMMA)

  def products(acc):
    if planes:
      return lambda b: (jnp.where(column == columns[b], acc * LO_STEPS,
                                  jnp.where(column == columns[b] + 1, acc, 0))
                        .sum(axis=1).astype(jnp.float32) * plane_scales[b])
    return lambda b: jnp.where(column == columns[b], acc, 0.0).sum(axis=1)
  return [products(acc) for acc in accs]


def scaled(products, row_scale):
  return lambda b: products(b) * row_scale


def update_candidates(spec: RowSpec, product_of, rows, base_of, best, nan_lanes,
                       sample):
  """One 64-row chunk into the per-lane candidates: for every batch row b the logits
  ``product_of(b)`` (W·z_b in fp32) + base_of(b), NaN lanes flagged, the greedy or Gumbel
  score, and an update to the higher score, on a tie to the lower row — so the result
  does not depend on the order the chunks come in (``chunk_schedule``). ``sample``:
  (streams, score_scale, noise_on) per row, None when greedy."""
  new_best = []
  for b in range(spec.batch):
    logits = product_of(b) + base_of(b)
    nan_lanes = nan_lanes | jnp.where(logits != logits, 1, 0)
    scores = (logits if spec.greedy else
              chunk_scores(spec, logits, rows, sample[0][b], sample[1][b], sample[2][b]))
    better = (scores > best[b][0]) | ((scores == best[b][0]) & (rows < best[b][1]))
    new_best.append((jnp.where(better, scores, best[b][0]),
                     jnp.where(better, rows, best[b][1])))
  return new_best, nan_lanes
