"""Any head on the tensor cores, a launch a step: the head's update in XLA, the
vocabulary on the batched Mosaic kernel (``MosaicConfig(kernel="steps")``).

The batched kernel runs a head's update inside only where it fits a block (vanilla: none;
gated: G_e streamed through its ring). The rnn head's update reads a [3r, 2r] matrix a
step (768 KB at r = 256: 100 MB of L2 a step if every block ran it), so here each step
is XLA's update of every row — the reference's own ``advance``, the same ops, so the
state is the reference's bit for bit — then one launch of the batched kernel with z as a
hi + lo bf16 pair (``plan.z_input``: copied whole into its swizzled tiles, two WGMMAs a
chunk, z to 2^-17 of each element) for ``W2 · z``, the base logits of that step and the
selection (its Gumbel streams keyed by the walk's step, as the one-launch kernel's).
W2 is streamed again at every launch: this trades the walk's residency for any head on
the tensor cores.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from wts_jax.pallas.mosaic_batched_plan import BATCH_TILE
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS


@dataclasses.dataclass(frozen=True)
class SteppedSpec:
  batched: object   # the BatchedSpec of one launch (``plan.z_input``, one step)
  batch: int
  steps: int


def split_hi_lo(z: jax.Array) -> jax.Array:
  """[B, r] fp32 -> [2, 64, r] bf16: hi = bf16(z), lo = bf16(z - hi), rows past B zero."""
  hi = z.astype(jnp.bfloat16)
  lo = (z - hi.astype(jnp.float32)).astype(jnp.bfloat16)
  pair = jnp.stack([hi, lo])
  return jnp.pad(pair, ((0, 0), (0, BATCH_TILE - z.shape[0]), (0, 0)))


@functools.partial(jax.jit, static_argnames=("spec",))
def stepped_walk(spec: SteppedSpec, head, base_logits, first_tokens, hidden, score_scale,
                 noise_on, seed):
  """The walk (``WalkOutput``): K steps of XLA's update and one kernel launch a step for
  every 64 rows."""
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.mosaic_backend import confidence_logits
  from wts_jax.pallas.mosaic_batched_walk import batched_walk, row_launches
  from wts_jax.reference import clamp_first_tokens
  serial = head.markov_head
  vocab = head.config.vocab_size
  first, status = clamp_first_tokens(first_tokens, vocab)
  hoisted = serial.hoist(hidden) if hidden is not None else None
  w2 = serial.markov_w2.weight[...]
  launches = row_launches(spec.batched, spec.batch)
  # Padded once (rows to the launch's, V to whole 64-column tiles), not at every launch.
  bases = [jnp.pad(base_logits[rows], ((0, launch.plan.batch_rows - launch.batch), (0, 0),
                                       (0, -vocab % CHUNK_ROWS)))
           for rows, launch in launches]

  def step(carry, k):
    x_prev, state, flags = carry
    e = serial.embed(x_prev)
    state, z = serial.advance(state, e, None if hoisted is None else
                              serial.hoisted_at(hoisted, k))
    tokens = []
    for (rows, launch), base in zip(launches, bases):
      sampled = ({} if spec.batched.greedy else
                 dict(seed=seed, score_scale=score_scale[rows], noise_on=noise_on[rows]))
      part, part_flags = batched_walk(launch, w2, base, None, None,
                                      z_pair=split_hi_lo(z[rows].astype(jnp.float32)),
                                      step=k, **sampled)
      tokens.append(part[:, 0])
      flags = flags | part_flags
    tokens = tokens[0] if len(tokens) == 1 else jnp.concatenate(tokens)
    return (tokens, state, flags), tokens

  (_, _, flags), tokens = jax.lax.scan(
      step, (first, serial.init_state(spec.batch), jnp.int32(0)), jnp.arange(spec.steps))
  tokens = tokens.T
  return WalkOutput(tokens=tokens, status=status | flags,
                    confidence=confidence_logits(head, hidden, first, tokens,
                                                 serial.markov_w1.weight[...]))
