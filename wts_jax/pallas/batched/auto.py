"""The batched kernel's planner where a config leaves a choice open: each ``auto_*``
returns what measured fastest on the H200 (the tuned table, ``pallas/tuned/``, holds
whole configs; these are its fallback for shapes and devices it does not list). Each
choice's measurement: ``docs/decisions.md``, "The batched kernel's fallback choices"."""

from __future__ import annotations

from wts_jax.pallas.batched.plan import DEFAULT_RING_STAGES, PLANES_ON_N_MIN_RANK

# Where "auto" takes this kernel, (low, high] rows, greedy and sampled (measured at the
# Qwen3 shape: the row kernel is faster at one row, this kernel from 4 rows).
AUTO_BATCHED_RANGE = (1, 64)
# Where "auto" widens an int8 W2 met by a bf16 z (``BatchedPlan.w2_widening``), measured
# at B 1, 4, 16 and 64: into the WGMMA's A operand up to 16 rows (the batch on
# N; the chunk streams as int8 and no bf16 copy is made before the launch), a bf16 copy
# before the launch past them (there the batch goes on M, and "registers" needs N); the
# rnn head's sampled walk in registers up to 4 rows only (one warpgroup draws its noise).
AUTO_WIDEN_IN_REGISTERS_MAX = 16
AUTO_WIDEN_IN_REGISTERS_RNN_SAMPLED_MAX = 4
# The planner's choices where the config leaves them, read from one sweep of every
# orientation, warpgroup count, producer, ring depth and base ring at B 4, 16, 32 and 64,
# greedy and sampled, per head and W2 dtype (H200):
# - the batch on N up to 32 rows (on M the WGMMA computes 64 rows whatever B, and the
#   sampled epilogue draws noise for all 64);
# - two computing warpgroups for sampling, for int8 planes, and for bf16 greedy walks on
#   N past 16 rows (on M, one); the gated head two only for sampling past 16 rows or on
#   M, the rnn head two only for sampling on M (its greedy walks and its sampled walks
#   on N measured slower with two);
# - a producer warpgroup beside two computing ones for greedy walks (for sampling the
#   computing warpgroups' own refills measured faster);
# - warpgroup 1's bests merged unreduced (``merge_tiles``) on N up to 16 rows;
# - the vanilla and gated heads' ring as deep as 4 slots before any chunk stays resident
#   (the walk waits on streamed chunks' latency, not on their bandwidth), and on M with two
#   warpgroups a 1-slot base ring, which leaves the W2 ring its second or third slot
#   (the rnn head's two warpgroups on M: a 1-slot ring each beside its resident rows).
AUTO_BATCH_ON_N_MAX = 32
# "auto" takes it up to 4 rows, where it measured faster than the split update in every
# mode and dtype (at 16 rows slower).
AUTO_JOINT_TABLE_MAX_ROWS = 4
AUTO_MERGE_TILES_MAX = 16
AUTO_ONE_WARPGROUP_BF16_GREEDY_MAX = 16
AUTO_ONE_WARPGROUP_GATED_SAMPLED_MAX = 16
AUTO_RING_PREFERENCE = 4
AUTO_BASE_STAGES_TWO_ON_M = 1
# The ring depth at or below which a streamed chunk's slot is refilled before its
# epilogue (``BatchedSpec.ring_refill``): a 1-slot ring's copy otherwise waits out the
# whole epilogue.
AUTO_EARLY_REFILL_MAX_SLOTS = 1
# The vanilla head's greedy walks on N up to 16 rows: each chunk's WGMMA issued before the
# previous chunk's epilogue, in groups of 2 (faster at B 4 and 16, bf16 and int8 planes;
# sampled walks, the gated and rnn heads and the batch on M measured slower).
AUTO_OVERLAP_CHUNKS = 2
AUTO_OVERLAP_MAX = 16


def auto_batch_axis(batch: int, *, int8_state: bool, greedy: bool,
                    batch_on_n_lowers: bool = True, rank: int = 256) -> str:
  del greedy   # (the same limit for all: measured)
  if int8_state and rank < PLANES_ON_N_MIN_RANK:
    return "m"
  return "n" if batch_on_n_lowers and batch <= AUTO_BATCH_ON_N_MAX else "m"


def auto_w2_widening(batch: int, *, batch_axis: str | None, gate_split: bool,
                     in_registers_lowers: bool, recurrent: bool = False,
                     greedy: bool = True) -> str:
  """Where an int8 W2 met by a bf16 z is widened: "registers" up to
  ``AUTO_WIDEN_IN_REGISTERS_MAX`` rows (the rnn head's sampled walk
  ``AUTO_WIDEN_IN_REGISTERS_RNN_SAMPLED_MAX``) where the batch may go on N, the gated
  head's gate is split and the WGMMA can take its A operand from registers
  (``in_registers_lowers``: jax >= 0.11, not interpret mode); else "xla"."""
  most = (AUTO_WIDEN_IN_REGISTERS_RNN_SAMPLED_MAX if recurrent and not greedy
          else AUTO_WIDEN_IN_REGISTERS_MAX)
  in_registers = (batch <= most and batch_axis in (None, "n") and gate_split
                  and in_registers_lowers)
  return "registers" if in_registers else "xla"


def auto_warpgroups(batch_axis: str, *, int8_state: bool, greedy: bool,
                    gated: bool = False, batch: int = 1, w2_in_registers: bool = False,
                    recurrent: bool = False, w2_row_scale: bool = False) -> int:
  """Computing warpgroups a block. The gated and rnn heads on M: two for sampling, and
  for a greedy walk past ``AUTO_BATCH_ON_N_MAX`` rows whose W2 is bf16 (faster at 64
  rows; an int8 W2 widened before the launch, ``w2_row_scale``, measured no faster)."""
  two_on_m = batch_axis == "m" and (
      not greedy or (not w2_row_scale and batch > AUTO_BATCH_ON_N_MAX))
  if recurrent:
    return 2 if two_on_m else 1
  if w2_in_registers:
    # (An int8 chunk widened in registers is half a bf16 one: two warpgroups fit, and
    # measured faster for the vanilla and gated heads, greedy and sampled.)
    return 2
  if gated:
    return 2 if two_on_m or (not greedy
                             and batch > AUTO_ONE_WARPGROUP_GATED_SAMPLED_MAX) else 1
  if not greedy or int8_state:
    return 2
  return 2 if batch_axis == "n" and batch > AUTO_ONE_WARPGROUP_BF16_GREEDY_MAX else 1


def auto_producer(batch_axis: str, warpgroups: int, *, int8_state: bool,
                  greedy: bool, gated: bool = False) -> bool:
  """A producer warpgroup beside two computing warpgroups of a greedy walk, the vanilla
  head's."""
  del batch_axis, int8_state
  return warpgroups == 2 and greedy and not gated


def auto_merge_tiles(batch_axis: str, warpgroups: int, batch: int, *,
                     gated: bool = False) -> bool:
  """Warpgroup 1's bests handed over unreduced where they measured faster: two computing
  warpgroups on N up to 16 rows, the vanilla head (past 16 rows the three tiles cost a
  resident chunk or a ring slot a warpgroup, which measured the larger loss)."""
  return (warpgroups == 2 and batch_axis == "n" and batch <= AUTO_MERGE_TILES_MAX
          and not gated)


def auto_ring_preference(*, recurrent: bool = False, redundant_gate: bool = False,
                         joint_table: bool = False) -> int:
  """The ring slots the planner takes before keeping chunks resident: the deeper ring for
  the vanilla head, the gated head's table or split gate (the split gate at 64 rows
  measured faster) and the rnn head's joint table (``joint_table``; faster or even at
  1-4 rows); the default for the rnn head's split update (``recurrent``; deeper, its
  int8 walks at 1-16 rows measured no clear gain)
  and for a gate computed by every block (``redundant_gate``: its G_e chunks share the
  ring; not measured)."""
  if joint_table:
    return AUTO_RING_PREFERENCE
  return DEFAULT_RING_STAGES if recurrent or redundant_gate else AUTO_RING_PREFERENCE


def auto_ring_refill(ring_stages: int, *, widened_in_kernel: bool) -> str:
  """``BatchedSpec.ring_refill`` where it measured faster: before the epilogue for a ring
  of ``AUTO_EARLY_REFILL_MAX_SLOTS`` slot (faster for the gated and rnn heads' sampled
  walks at 64 rows, bf16 and int8; with 2 to 4 slots no clear gain), never where an int8 W2 is widened in the kernel (its threads read the
  slots); else after it (a W2 all resident has no ring to refill)."""
  return ("before_epilogue" if 0 < ring_stages <= AUTO_EARLY_REFILL_MAX_SLOTS
          and not widened_in_kernel else "after_epilogue")


def auto_base_stages(batch_axis: str, warpgroups: int, *, gated: bool = False,
                     recurrent: bool = False, w2_row_scale: bool = False) -> int | None:
  """The base ring's slots where the planner's default (3) is not the measured best: one
  on M with two computing warpgroups, the vanilla and rnn heads' and the gated head's
  with a bf16 W2 (faster for its sampled walk at 64 rows; with an int8 W2 widened
  before the launch, ``w2_row_scale``, slower), or None.
  ``gated``: the gated or rnn head; ``recurrent``: the rnn head."""
  if (batch_axis == "m" and warpgroups == 2
      and (recurrent or not gated or not w2_row_scale)):
    return AUTO_BASE_STAGES_TWO_ON_M
  return None


def auto_warp_gather(batch_axis: str, *, int8_state: bool) -> bool:
  """``BatchedPlan.warp_gather`` where it measured faster: int8 planes on M (at 64 rows,
  greedy and sampled; on M at 16 rows it measured slower, for bf16 no faster)."""
  return int8_state and batch_axis == "m"


def auto_overlap_chunks(batch_axis: str, batch: int, *, greedy: bool, gated: bool,
                        widened_in_kernel: bool) -> int:
  """Chunks a group whose WGMMAs overlap epilogues (``BatchedPlan.overlap_chunks``) where
  that measured faster: the vanilla head's greedy walks on N up to ``AUTO_OVERLAP_MAX``
  rows, its W2 not widened in the kernel (which needs each chunk's own wait); else 0.
  ``gated``: the gated or rnn head."""
  return (AUTO_OVERLAP_CHUNKS if greedy and batch_axis == "n" and batch <= AUTO_OVERLAP_MAX
          and not gated and not widened_in_kernel else 0)

