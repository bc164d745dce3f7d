"""The cross-device exchange *inside* a persistent Mosaic GPU kernel, and a probe kernel
that runs it. UNTIMED: it lowers and compiles for two H200s (without a GPU); it has not
run on one (no multi-GPU machine was lent when it was written). Never NVLink multicast:
every remote operation below is a point-to-point store, atomic or signal to one peer.

The protocol extends the batched kernel's exchange keys (``pallas.grid_sync``: a
candidate is one 64-bit key, ``orderable(score) << 32 | ~index``, whose unsigned order is
the selection order) from the blocks of one GPU to the blocks of every GPU of the
vocabulary axis. Per walk step ``k``, every block ``p`` of every device:

1. publishes its best key of each batch row with ``red.relaxed.sys.global.max.u64``
   into row ``b`` of step ``k``'s slots *on every device* of the axis (its own through
   its own pointer, each peer's through ``plgpu.remote_ref``: a point-to-point NVLink
   atomic, one per row and peer);
2. after a warpgroup barrier (every thread's atomics issued), one thread signals every
   device's walk semaphore with a sys-scope release (``semaphore_signal(...,
   device_id=peer, memory_scope="sys")``): cumulative over the warpgroup's atomics;
3. polls its own device's semaphore (``semaphore_read``: ``ld.acquire.sys``) until it
   reaches ``(k + 1) · blocks · devices`` or ``spin_limit`` polls have passed (then the
   walk reports ``STATUS_SYNC_TIMEOUT``; it never hangs);
4. reads each row's winning key from its own device's slots (``ld.relaxed.sys``, after
   the acquire) — the same key on every device: the token.

Invariants:
- the slots (one per (step, row), never reused within a walk) and the semaphore are
  ``pl.get_global`` buffers, zero at every launch; XLA synchronizes the devices before a
  kernel that communicates (the custom call's device barrier), so no peer's atomic can
  land before a device's buffers are zeroed;
- every block signals every device exactly once a step, after its atomics, so a
  device's semaphore reaches ``(k + 1) · blocks · devices`` exactly when every block of
  every device has published step ``k``: no block reads step ``k``'s slots before the
  last key of step ``k`` has landed, and no block runs more than one step ahead;
- atomic max is order-free: all devices read the same winner whatever order the keys
  arrive in, so all agree on the token without a broadcast (ties: the lower index wins
  by the key's low word, as ``exchange.pick`` decides; a NaN score never wins a key,
  as in the kernels on one GPU — the walk's status reports it).

One level (every block to every device) rather than two (the device's winner first, then
one block forwarding it) so that a step pays one NVLink latency, not a grid barrier plus
one. ``docs/sharded.md`` has the cost model and how the walk kernels adopt it; the probe
below is that exchange alone in a persistent loop: each block's candidates come from an
input (what its shard scan would give), shifted by the previous token so every step
depends on the last.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

ROWS = 128            # one warpgroup: thread t owns batch row t
KEY_WORDS = 2         # a 64-bit key as two 32-bit words


@dataclasses.dataclass(frozen=True)
class ProbeShape:
  steps: int
  blocks: int
  batch: int
  axis_name: str
  num_devices: int
  spin_limit: int = 1 << 22

  def __post_init__(self):
    if not 1 <= self.batch <= ROWS:
      raise ValueError(f"batch={self.batch} must be in [1, {ROWS}] (one warpgroup)")


# The batched kernel's ``publish_keys`` and ``collect_keys`` (``pallas.grid_sync``) at
# system scope, one thread a row: ``red.max`` the row's key (``keys_s`` [2, ROWS] u32,
# high words then low words) into its slot; or read the row's winning key back.
_PUBLISH_SYS = ("@p ld.shared.b32 hi, [sa]; @p ld.shared.b32 lo, [sa+{low_offset}];\n"
                "mov.b64 key, {{lo, hi}};\n"
                "@p red.relaxed.sys.global.max.u64 [g], key;\n")
_COLLECT_SYS = ("@p ld.relaxed.sys.global.b64 key, [g];\n"
                "mov.b64 {{lo, hi}}, key;\n"
                "@p st.shared.b32 [sa], hi; @p st.shared.b32 [sa+{low_offset}], lo;\n")


def _on_row_slots(body: str, keys_s, slots_g, rows: int):
  """Run ``body`` (``_PUBLISH_SYS`` or ``_COLLECT_SYS``) for the first ``rows`` rows
  between ``keys_s`` and ``slots_g`` (a step's slots, one 64-bit key a row; a peer's
  through ``remote_ref``). A collect runs after the poll's acquire, and a barrier must
  follow it before other threads read ``keys_s``."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax.pallas import grid_sync

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def run(_, keys, slots):
    grid_sync.row_slot_asm(body, keys, slots, rows, slot_bytes=4 * KEY_WORDS)
  run(keys_s, slots_g)


def publish_to_devices(keys_s, step_slots, sem, shape: ProbeShape):
  """Steps 1–2 of the protocol: this block's keys into step ``k``'s slots of every
  device, then one sys-scope signal to each device's semaphore."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  for peer in range(shape.num_devices):
    _on_row_slots(_PUBLISH_SYS, keys_s, plgpu.remote_ref(step_slots, peer), shape.batch)
  for peer in range(shape.num_devices):
    plgpu.semaphore_signal(sem, 1, device_id=peer, memory_scope="sys")


def poll_devices(sem, step, shape: ProbeShape):
  """Step 3: wait (bounded) until every block of every device has signalled step
  ``step``. Returns 1 when the spin ran out, else 0."""
  target = (step + 1) * shape.blocks * shape.num_devices

  def waiting(state):
    polls, seen = state
    return jnp.logical_and(seen < target, polls < shape.spin_limit)

  def poll(state):
    polls, _ = state
    return polls + 1, pl.semaphore_read(sem)

  _, seen = lax.while_loop(waiting, poll, (jnp.int32(0), pl.semaphore_read(sem)))
  return jnp.where(seen < target, 1, 0)


def _required_load_arguments() -> set[str]:
  import inspect
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return {name for name, parameter in inspect.signature(plgpu.load).parameters.items()
          if parameter.default is inspect.Parameter.empty}


def _probe_kernel(scores_g, indices_g, first_g, tokens_g, timeouts_g, keys_s, *,
                  shape: ProbeShape):
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax.pallas import grid_sync
  block = lax.axis_index("blocks")
  row_layout = plgpu.Layout.WG_STRIDED((ROWS,), vec_size=1)
  slots = pl.get_global(plgpu.SemaphoreType.REGULAR((shape.steps * ROWS * KEY_WORDS,)))
  sem = pl.get_global(plgpu.SemaphoreType.REGULAR(()))

  def load(ref):
    if "idx" in _required_load_arguments():   # jax 0.10 takes the index apart
      return plgpu.load(ref, (), layout=row_layout, optimized=False)
    return plgpu.load(ref, layout=row_layout, optimized=False)

  def step_body(step, carry):
    previous, timed_out = carry
    # The block's candidates, as its shard scan would give them; shifted by the last
    # token so every step depends on the one before.
    score = (load(scores_g.at[step, block]) +
             0.5 * lax.rem(previous, 7).astype(jnp.float32))
    high, low = grid_sync.orderable_key(score, load(indices_g.at[step, block]))
    keys_s[0, :] = high
    keys_s[1, :] = low
    plgpu.commit_smem()
    step_slots = slots.at[pl.ds(step * ROWS * KEY_WORDS, ROWS * KEY_WORDS)]
    publish_to_devices(keys_s, step_slots, sem, shape)
    timed_out = timed_out | poll_devices(sem, step, shape)
    _on_row_slots(_COLLECT_SYS, keys_s, step_slots, shape.batch)
    plgpu.commit_smem()
    token = grid_sync.key_index(load(keys_s.at[1]))

    @pl.when(block == 0)
    def _():
      tokens_g[step, :] = token
    return token, timed_out

  _, timed_out = lax.fori_loop(0, shape.steps, step_body,
                               (load(first_g), jnp.int32(0)))
  timeouts_g[block] = timed_out


def exchange_probe(scores: jax.Array, indices: jax.Array, first_tokens: jax.Array, *,
                   axis_name: str, spin_limit: int = 1 << 22):
  """Run the probe on one device of ``axis_name`` (inside ``shard_map``): ``scores`` /
  ``indices`` [K, blocks, ROWS] this device's blocks' candidates (global indices),
  ``first_tokens`` [ROWS]. Returns (tokens [K, ROWS], timeouts [blocks]) — the tokens
  the same on every device, and what ``probe_reference`` computes."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  steps, blocks, rows = scores.shape
  if rows != ROWS:
    raise ValueError(f"scores must be [K, blocks, {ROWS}]; got {scores.shape}")
  shape = ProbeShape(steps=steps, blocks=blocks, batch=ROWS, axis_name=axis_name,
                     num_devices=lax.axis_size(axis_name), spin_limit=spin_limit)
  kernel = plgpu.kernel(
      functools.partial(_probe_kernel, shape=shape),
      out_type=(jax.ShapeDtypeStruct((steps, ROWS), jnp.int32),
                jax.ShapeDtypeStruct((blocks,), jnp.int32)),
      grid=(blocks,), grid_names=("blocks",),
      scratch_types=[plgpu.SMEM((KEY_WORDS, ROWS), jnp.uint32)],
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane))
  return kernel(scores, indices.astype(jnp.int32), first_tokens.astype(jnp.int32))


def probe_reference(scores: jax.Array, indices: jax.Array,
                    first_tokens: jax.Array) -> jax.Array:
  """What the probe must return, in XLA: ``scores`` / ``indices`` [devices, K, blocks,
  ROWS] of every device → tokens [K, ROWS] (the highest score, the lowest index among
  equal ones; ``exchange.pick``'s rule over every block of every device)."""
  from wts_jax.sharded.exchange import pick
  devices, steps, blocks, rows = scores.shape
  previous = first_tokens.astype(jnp.int32)
  tokens = []
  for step in range(steps):
    shifted = scores[:, step] + 0.5 * lax.rem(previous, 7).astype(jnp.float32)
    flat_scores = shifted.reshape(devices * blocks, rows)
    flat_indices = indices[:, step].reshape(devices * blocks, rows).astype(jnp.int32)
    winner = pick(flat_scores, flat_indices)
    previous = jnp.take_along_axis(flat_indices, winner[None], axis=0)[0]
    tokens.append(previous)
  return jnp.stack(tokens)
