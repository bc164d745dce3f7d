"""The plan of a Mosaic GPU walk (``row/kernel.py``): how each block's W2 shard is cut
into 64-row chunks, which stay resident in shared memory and which stream through the TMA
ring, what else the shared memory holds, and the order of a step's chunks. Pure Python on
static shapes: the budget checks happen here, before anything is lowered or launched."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from wts_jax.device import H200
from wts_jax.walk_config import resident_units

CHUNK_ROWS = 64            # rows per register GEMV (the WGMMA layout's row tile)
Z_TILE_ROWS = 8            # WGMMA GEMV: W1 rows per batch row in shared memory (n = 8B)
MAX_BATCH = 4              # rows per launch: per-row candidates, staging and exchange
AUTO_MAX_BATCH = 1         # where "auto" picks this kernel: from 4 rows the batched kernel
                           # (batch on N) measured faster
RING_STAGE_MIN = 1
DEFAULT_RING_STAGES = 2     # the default split, measured fastest: 2 resident chunks
DEFAULT_RESIDENT_CHUNKS = 2  # + a 2-slot ring beat 0/2/4 + 2, 0 + 1/3/6, 3 + 3, 2 + 4
DEFAULT_PLANES_RESIDENT_GROUP = 1   # int8 planes: on-chip chunks per WGMMA wait (1: rolled)
SMEM_RESERVED_BYTES = 3072  # 2 KB reduction scratch, barriers
SMEM_ALIGNMENT = 1024      # every scratch allocation starts on a 1 KB boundary


def row_swizzle(rank: int, itemsize: int) -> int:
  """The swizzle of a W2 chunk's or z's shared-memory tile: 128 bytes (conflict-free row
  loads in the WGMMA layout), or the width of a narrower row (int8 at r = 64)."""
  return min(128, rank * itemsize)


@dataclasses.dataclass(frozen=True)
class MosaicPlan:
  """A launch of the Mosaic kernel (all sizes static)."""

  num_blocks: int
  chunks: int               # 64-row chunks of W2 per block
  resident_chunks: int      # kept in shared memory for the whole walk
  ring_stages: int          # shared-memory slots of the streaming ring
  vocab_size: int
  rank: int
  smem_per_block: int
  staged_batch: int = MAX_BATCH   # base-logit rows the shared-memory staging holds
  base_itemsize: int = 2          # bytes per staged base logit
  gemv: str = "wgmma"             # or "registers"
  w2_itemsize: int = 2            # 2: bf16 W2; 1: int8 W2 with a scale per row
  group: int = 1                  # WGMMA GEMV: chunks in flight together, one wait each
  # WGMMA GEMV: the same for the chunks on chip (shared memory or registers), which hold
  # no ring slot while in flight (0: as ``group``).
  resident_group: int = 0
  snake: bool = True              # stream odd steps' chunks in reverse order (L2 reuse)
  gated: bool = False             # the gated head: G_e resident, the gate computed per step
  # int8 W2 × z as two int8 planes (``wts_jax.int8_state``) on the WGMMA, s32 products:
  # the z tile holds W1's interleaved planes (4 tokens per 8 rows) instead of bf16 rows.
  int8_state: bool = False
  # int8 planes only: chunks held in registers for the whole walk as the WGMMA's A
  # operand (32 registers a thread each), after the shared-memory resident ones.
  register_chunks: int = 0

  @property
  def exchange_lanes(self) -> int:
    # One (score, index) slot per block in the global exchange, padded to whole
    # 128-lane row vectors.
    return max(128, -(-self.num_blocks // 128) * 128)

  @property
  def on_chip_group(self) -> int:
    return self.resident_group or self.group

  @property
  def streamed_chunks(self) -> int:
    return self.chunks - self.resident_chunks - self.register_chunks

  @property
  def resident_fraction(self) -> float:
    on_chip = self.resident_chunks + self.register_chunks
    return min(1.0, on_chip * self.num_blocks * CHUNK_ROWS / self.vocab_size)

  def describe(self) -> str:
    chunk_kb = CHUNK_ROWS * self.rank * self.w2_itemsize / 1024
    return (f"Mosaic GPU walk: {self.num_blocks} blocks × {self.chunks} chunks of "
            f"{CHUNK_ROWS} rows; {self.resident_chunks} chunks resident in shared memory"
            + (f" and {self.register_chunks} in registers" if self.register_chunks else "")
            + f" ({self.resident_fraction:.0%} of W2), {self.streamed_chunks} streamed per "
            f"step through a {self.ring_stages}-slot TMA ring ({chunk_kb:.0f} KB a slot)"
            + (f"; GEMV on tensor cores (WGMMA, {self.group} streamed / "
               f"{self.on_chip_group} on-chip chunk(s) per wait)"
               if self.gemv == "wgmma" else "")
            + ("; odd steps stream in reverse (snake)" if self.snake and self.streamed_chunks
               else "")
            + ("; int8 W2, per-row scales in shared memory" if self.w2_itemsize == 1
               else "")
            + ("; z as two int8 planes (int8 x int8 WGMMA)" if self.int8_state else "")
            + ("; gated head, G_e resident in shared memory" if self.gated else ""))


def chunks_per_block(vocab_size: int, num_blocks: int) -> int:
  """The 64-row chunks each block's shard of the vocabulary is cut into."""
  return math.ceil(math.ceil(vocab_size / num_blocks) / CHUNK_ROWS)


def launch_facts(config, device) -> tuple[int, int]:
  """(SMs, shared memory per block) a Mosaic walk plans for: ``device``'s, or in
  interpret mode one block with the H200's shared memory."""
  if config.interpret:
    return 1, H200.smem_per_block
  return device.num_sms, device.smem_per_block


def _aligned(nbytes: int) -> int:
  return -(-nbytes // SMEM_ALIGNMENT) * SMEM_ALIGNMENT


def staging_bytes(*, chunks: int, batch: int, base_itemsize: int,
                  gemv: str = "registers", rank: int = 256, scaled: bool = False,
                  gated: bool = False, int8_state: bool = False) -> int:
  """Shared memory besides the W2 slots: the base logits of two steps
  ([2, chunks, B, 64], staged by TMA one step ahead); with the WGMMA GEMV the W1 rows of
  z ([8B, r] bf16; int8 planes with ``int8_state``); for an int8 W2 the block's per-row scales ([chunks, 64] f32); for the
  gated head G_e ([r, r] bf16, resident) and the gate's pre-activations ([B, r] f32)."""
  base = 2 * chunks * batch * CHUNK_ROWS * base_itemsize
  z_rows = Z_TILE_ROWS * batch * rank * (1 if int8_state else 2) if gemv == "wgmma" else 0
  scales = chunks * CHUNK_ROWS * 4 if scaled else 0
  gate = _aligned(rank * rank * 2) + _aligned(batch * rank * 4) if gated else 0
  return _aligned(base) + _aligned(z_rows) + _aligned(scales) + gate


def plan_mosaic(*, vocab_size: int, rank: int, num_sms: int, smem_per_block: int,
                resident_chunks: int | None = None, ring_stages: int | None = None,
                num_blocks: int | None = None, batch: int = MAX_BATCH, base_itemsize: int = 2,
                gemv: str | None = None, w2_itemsize: int = 2, group: int = 1,
                snake: bool = True, gated: bool = False, int8_state: bool = False,
                register_chunks: int = 0, resident_group: int | None = None
                ) -> MosaicPlan:
  """Shard V over ``num_blocks`` (default: one block per SM) and split each shard's
  shared memory between resident chunks and the streaming ring.

  Default split: everything resident when it fits; otherwise a 2-slot ring and 2
  resident chunks (or the nearest count that leaves the streamed ones a whole number of
  ring rounds per step: the ring restarts every step, so every slot index is static) —
  the fastest split measured at the Qwen3 shape; filling the spare slots with
  resident chunks or ring slots was slower. The staging (``staging_bytes``: base logits
  of ``batch`` rows of ``base_itemsize`` bytes, the WGMMA's z, int8 scales, the gated
  head's G_e) comes out of the same shared memory first. ``group``: with the WGMMA GEMV, how many chunks' WGMMAs are issued before
  one wait (their latencies overlap; a streamed group's slots are refilled after it).
  ``snake``: odd steps stream their chunks last to first, so a step starts on the chunks
  the previous one read last — still in the L2 when the whole W2 is not.
  ``gated``: the gated head (register GEMV: its z = g ⊙ e is fp32); G_e stays in shared
  memory (128 KB at r = 256, which leaves W2 two slots there). ``int8_state``: an int8 W2
  meets z as two int8 planes on the WGMMA (``wts_jax.int8_state``); its default split
  keeps as many chunks resident as leave a 2-slot ring whole rounds (10 + 2 at the
  Qwen3 shape: measured fastest). ``register_chunks``: int8 planes only, that
  many chunks held in registers as the WGMMA's A operand (staged once through the
  shared-memory slots), taken from the streamed ones. ``resident_group``: with the WGMMA
  GEMV, how many on-chip chunks' WGMMAs are issued before one wait (default: ``group``;
  int8 planes: ``DEFAULT_PLANES_RESIDENT_GROUP``)."""
  if w2_itemsize not in (1, 2):
    raise ValueError(f"w2_itemsize={w2_itemsize}: the Mosaic walk streams bf16 (2) or "
                     "int8 (1) W2 rows")
  if gemv is None:   # the tensor cores where they apply (measured faster)
    gemv = "registers" if (w2_itemsize == 1 and not int8_state) or gated else "wgmma"
  if register_chunks and not int8_state:
    raise ValueError(f"register_chunks={register_chunks}: chunks are held in registers "
                     "only as int8 WGMMA operands (an int8 W2 with z as two int8 planes)")
  if register_chunks < 0:
    raise ValueError(f"register_chunks={register_chunks} must be >= 0")
  if int8_state and (w2_itemsize != 1 or gemv != "wgmma" or gated):
    raise ValueError("int8 planes of z run on the WGMMA GEMV of an int8 W2, vanilla head "
                     f"(got w2_itemsize={w2_itemsize}, gemv={gemv!r}, gated={gated})")
  if gated and gemv == "wgmma":
    raise ValueError("the WGMMA GEMV needs a bf16 z (the vanilla head's W1 row); the "
                     "gated head's z = g ⊙ e is fp32: use the register GEMV")
  if gemv not in ("registers", "wgmma"):
    raise ValueError(f"gemv={gemv!r} must be 'registers' or 'wgmma'")
  if group < 1 or (group > 1 and gemv != "wgmma"):
    raise ValueError(f"group={group}: chunks are grouped (>= 1) only for the WGMMA GEMV")
  if resident_group is None:
    resident_group = DEFAULT_PLANES_RESIDENT_GROUP if int8_state else 0
  if resident_group < 0 or (resident_group > 1 and gemv != "wgmma"):
    raise ValueError(f"resident_group={resident_group}: chunks are grouped (>= 1) only "
                     "for the WGMMA GEMV")
  if rank % 64 or rank > 256:
    raise ValueError(f"rank={rank} must be a multiple of 64 and <= 256 for the Mosaic walk")
  if vocab_size < CHUNK_ROWS or vocab_size % 8:
    raise ValueError(f"vocab_size={vocab_size} must be a multiple of 8 (TMA tiles W2 "
                     f"rows by 8) and >= {CHUNK_ROWS} for the Mosaic walk")
  blocks = num_blocks or num_sms
  if blocks > num_sms:
    raise ValueError(f"num_blocks={blocks} exceeds the {num_sms} SMs: the blocks could "
                     "not all be co-resident and the grid barrier would time out")
  chunks = chunks_per_block(vocab_size, blocks)
  chunk_bytes = CHUNK_ROWS * rank * w2_itemsize
  if not 1 <= batch <= MAX_BATCH:
    raise ValueError(f"batch={batch} must be in [1, {MAX_BATCH}] for the Mosaic walk")
  staging = staging_bytes(chunks=chunks, batch=batch, base_itemsize=base_itemsize,
                          gemv=gemv, rank=rank, scaled=w2_itemsize == 1, gated=gated,
                          int8_state=int8_state)
  slots = (smem_per_block - SMEM_RESERVED_BYTES - staging) // chunk_bytes
  if slots < 2:
    raise ValueError(f"{smem_per_block} bytes of shared memory hold fewer than two "
                     f"{chunk_bytes}-byte chunks")
  if register_chunks > chunks:
    raise ValueError(f"register_chunks={register_chunks} exceeds the {chunks} chunks")
  shared_chunks = chunks - register_chunks   # in shared memory or streamed

  def fitting_resident(stages):
    # bf16: from DEFAULT_RESIDENT_CHUNKS up (then below it), the first count that leaves
    # a whole number of ring rounds per step (the ring restarts each step, so its slots
    # are static indices). Not "as many as fit": on the H200 more resident chunks and a
    # deeper ring were slower for bf16; for int8 planes the most that fit was fastest.
    most = min(shared_chunks, slots - stages)
    order = ([*range(most, -1, -1)] if int8_state else
             [*range(min(DEFAULT_RESIDENT_CHUNKS, most), most + 1),
              *range(0, min(DEFAULT_RESIDENT_CHUNKS, most))])
    for resident in order:
      if resident == shared_chunks or (stages and (shared_chunks - resident) % stages == 0):
        return resident
    return None

  if resident_chunks is None:
    if shared_chunks <= slots and ring_stages in (None, 0):
      resident_chunks, ring_stages = shared_chunks, 0
    else:
      ring_stages = DEFAULT_RING_STAGES if ring_stages is None else ring_stages
      ring_stages = min(ring_stages, slots)
      resident_chunks = fitting_resident(ring_stages)
      if resident_chunks is None:
        raise ValueError(f"no split of {chunks} chunks fits {slots} shared-memory slots "
                         f"with a {ring_stages}-slot ring")
  elif ring_stages is None:
    resident_chunks = min(resident_chunks, shared_chunks)
    streamed = shared_chunks - resident_chunks
    ring_stages = next((s for s in range(min(DEFAULT_RING_STAGES, streamed), 0, -1)
                        if streamed % s == 0 and resident_chunks + s <= slots), 0)
  resident_chunks = min(resident_chunks, shared_chunks)
  streamed = shared_chunks - resident_chunks
  if streamed == 0:
    ring_stages = 0
  elif ring_stages < RING_STAGE_MIN:
    raise ValueError(f"{streamed} streamed chunks need a ring slot")
  elif streamed % ring_stages:
    raise ValueError(f"{streamed} streamed chunks are not a whole number of rounds of a "
                     f"{ring_stages}-slot ring")
  if resident_chunks + ring_stages > slots:
    raise ValueError(f"{resident_chunks} resident chunks + {ring_stages} ring slots exceed "
                     f"the {slots} chunks of shared memory per block")
  if register_chunks > resident_chunks + ring_stages:
    raise ValueError(f"register_chunks={register_chunks} are staged through the "
                     f"{resident_chunks + ring_stages} shared-memory slots: too few")
  if streamed and group > ring_stages:
    raise ValueError(f"group={group} chunks in flight need as many ring slots "
                     f"(the ring has {ring_stages})")
  return MosaicPlan(num_blocks=blocks, chunks=chunks, resident_chunks=resident_chunks,
                    ring_stages=ring_stages, vocab_size=vocab_size, rank=rank,
                    smem_per_block=smem_per_block, staged_batch=batch,
                    base_itemsize=base_itemsize, gemv=gemv,
                    w2_itemsize=w2_itemsize, group=group, snake=snake, gated=gated,
                    int8_state=int8_state, register_chunks=register_chunks,
                    resident_group=resident_group)


def chunk_schedule(resident: int, streamed: int, group: int, registers: int = 0,
                   resident_group: int = 0):
  """A step's chunks in order, in groups of ``group``: ("streamed", [j, ...]) in ring
  order with the ("resident", [c, ...]) groups spread evenly among them, so the TMA
  ring keeps streaming while resident chunks are computed (resident chunks first left the
  full ring idle for their whole duration: 3 + 3 measured slower than 0 + 3).
  Chunks held in registers (ids ``resident ..``) count as resident here, in groups of
  ``resident_group`` (0: ``group``)."""
  def groups(kind, n, size):
    return [(kind, list(range(s, min(s + size, n)))) for s in range(0, n, size)]
  streamed_groups = groups("streamed", streamed, group)
  resident_groups = groups("resident", resident + registers, resident_group or group)
  if not streamed_groups:
    return resident_groups
  order, placed = [], 0
  for i, streamed_group in enumerate(streamed_groups):
    order.append(streamed_group)
    due = (i + 1) * len(resident_groups) // len(streamed_groups)
    order += resident_groups[placed:due]
    placed = due
  return order


def mosaic_gemv(head, config) -> str:
  """The GEMV of this walk: the config's, or for "auto" the tensor cores (WGMMA) where
  they apply — the vanilla head, W1 of W2's dtype — else registers."""
  if config.gemv != "auto":
    return config.gemv
  serial = head.markov_head
  if serial.z_as_int8_planes:
    return "wgmma"
  same = (jnp.dtype(serial.markov_w1.weight.dtype)
          == jnp.dtype(serial.markov_w2.weight.dtype))
  return "wgmma" if same and head.config.head_type == "vanilla" else "registers"


def make_plan(head, config, device, *, batch: int = MAX_BATCH, base_itemsize: int = 2
              ) -> MosaicPlan:
  """The plan of ``head`` under ``config`` (a ``MosaicRowConfig``) on ``device`` (its
  ``DeviceFacts``; interpret mode runs one block), its base-logit staging sized for
  ``batch`` rows of ``base_itemsize`` bytes."""
  vocab, rank = head.config.vocab_size, head.config.rank
  num_sms, smem = launch_facts(config, device)
  blocks = config.num_blocks or num_sms
  chunks = chunks_per_block(vocab, blocks)
  residency = config.residency
  try:
    return plan_mosaic(vocab_size=vocab, rank=rank, num_sms=num_sms,
                       smem_per_block=smem,
                       resident_chunks=resident_units(residency, chunks, CHUNK_ROWS),
                       ring_stages=config.ring_stages, num_blocks=blocks,
                       batch=batch, base_itemsize=base_itemsize,
                       gemv=mosaic_gemv(head, config), group=config.group or 1,
                       snake=config.snake,
                       gated=head.config.head_type == "gated",
                       int8_state=head.markov_head.z_as_int8_planes,
                       register_chunks=config.register_chunks,
                       resident_group=config.resident_group,
                       w2_itemsize=jnp.dtype(head.markov_head.markov_w2.weight.dtype
                                             ).itemsize)
  except ValueError as err:
    if residency == "full":
      raise ValueError(f"residency='full' does not fit the Mosaic kernel's shared "
                       f"memory ({chunks} chunks of {CHUNK_ROWS} rows per block): {err}"
                       ) from err
    raise
