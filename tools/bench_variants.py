"""``wts-bench`` with the kernel's tuning variants registered as extra paths.

  python tools/bench_variants.py --paths wts,wts-triton,wts-mw-r0s6g3,... [wts-bench args]

``wts-triton`` is the Triton kernel, ``wts-split`` / ``wts-redundant`` the same with the
gated/rnn serial update split over the programs or done by each; ``wts-m-r{R}s{S}`` the
Mosaic GPU kernel with R resident 64-row chunks per block and an S-slot TMA ring
(register GEMV); ``wts-mw-r{R}s{S}`` the same with its GEMV on tensor cores (WGMMA), and
``wts-mw-r{R}s{S}g{G}`` with G chunks' WGMMAs in flight before one wait, ``x{X}`` with
X chunks held in registers (int8 planes), ``h{H}`` with H on-chip chunks per WGMMA
wait; a trailing
``f`` streams every step forward (no snake order). ``wts-mb`` is the batched Mosaic
kernel (the batch on the WGMMA's M) with its planner's split, ``wts-mb-r{R}s{S}b{N}``
with R resident chunks, an S-slot ring and an N-slot base-logit ring (each part
optional), ``…-w2`` with two warpgroups a block (else one), ``…-split`` / ``…-redundant``
with the gated head's gate split over the blocks or computed by every block (else the
planner's); ``wts-mbn…`` the same with the batch on the WGMMA's N; ``wts-mb-auto`` the
batched kernel with every choice the planner's (``kernel="batched"``, which also runs an
int8 W2 that z does not meet as planes, widened to bf16); ``wts-mb-widen-xla`` /
``wts-mb-widen-registers`` / ``wts-mb-widen-smem`` the same with that W2 widened by a bf16
copy before the launch or in the kernel (``w2_widening``),
``…-w2`` with two computing warpgroups; ``wts-stacked`` / ``wts-rows`` the stacked
int8-planes kernel / the row kernel by name; ``wts-stacked-status-flags`` / ``-kernel`` wts with
the stacked kernel's status reduced after the launch / in the kernel; ``wts-carry-last-column``
/ ``xla-carry-last-column`` wts / xla timed in the harness's older chain (the tokens' last
column sliced after each walk, ``timing.build_chain``'s carry_form); ``wts-stacked-w2-rows``
wts with the stacked kernel's W2 in row order (not its threads' rows);
``wts-batched-status-flags`` wts with the batched kernel's status reduced after the launch;
``wts-rnn-sliced-j-h`` wts with the rnn head's J_h sliced out of ``joint_proj`` every walk
(the head without ``wts_jax.with_joint_hidden``'s copy); ``wts-ring-deep`` wts with the
batched planner's ring preference the vanilla head's for the rnn head too;
``wts-joint-ring-shallow`` wts with the rnn joint table's ring preference the split
update's (2 slots before residency);
``wts-ring-refill-late`` wts with the batched kernel's streamed W2 slots refilled after
each chunk's epilogue (every plan; ``BatchedSpec.ring_refill``);
``wts-ring-refill-early`` wts with the batched kernel's streamed W2 slots refilled before
each chunk's epilogue (``BatchedSpec.ring_refill``; where no int8 W2 is widened in the
kernel); ``wts-hoist-splitP`` wts with the gated and rnn heads' hoist GEMM as P partial
products on K, summed after. Any R, S, G named in ``--paths`` is registered. Development sweeps only: the paths every report compares are
registered in ``wts_jax.bench.paths``.
"""

import functools
import re
import sys

import jax
import jax.numpy as jnp

from wts_jax.bench import cli, jax_paths, paths
from wts_jax.walk_config import (MosaicBatchedConfig, MosaicRowConfig, MosaicStackedConfig,
                                 TritonConfig)

MOSAIC_VARIANT = re.compile(
    r"wts-m(w?)-r(\d+)s(\d+)(?:g(\d+))?(?:h(\d+))?(?:x(\d+))?(f?)$")


HOIST_SPLIT_VARIANT = re.compile(r"wts-hoist-split(\d+)$")


BATCHED_VARIANT = re.compile(
    r"wts-mb(n?)(?:-r(\d+)s(\d+))?(?:b(\d+))?(?:-?w(\d))?(?:-(split|redundant))?$")


def register_batched(name, on_n, resident, stages, base_stages, warpgroups, update):
  options = dict(batch_axis="n" if on_n else "m", warpgroups=int(warpgroups or 1),
                 serial_update=update or "auto")
  if resident is not None:
    options.update(residency=int(resident) * 64, ring_stages=int(stages) or None)
  if base_stages is not None:
    options["base_stages"] = int(base_stages)
  paths.register_path(name, jax_paths.available_wts,
                      jax_paths.wts_variant(MosaicBatchedConfig(**options)),
                      description="batched Mosaic kernel" + (", batch on N" if on_n else "")
                      + (f", {resident} resident chunks, {stages}-slot ring"
                         if resident is not None else "")
                      + (f", {base_stages}-slot base ring" if base_stages else "")
                      + (f", {warpgroups} warpgroups a block" if warpgroups else "")
                      + (f", the head's update {update}" if update else ""))


def register_variants(names):
  if "wts-triton" not in paths.PATHS:
    paths.register_path("wts-triton", jax_paths.available_wts,
                        jax_paths.wts_variant(TritonConfig()),
                        description="the persistent Triton kernel")
  for update in ("split", "redundant"):   # the gated/rnn serial update (Triton kernel)
    if f"wts-{update}" not in paths.PATHS:
      paths.register_path(f"wts-{update}", jax_paths.available_wts,
                          jax_paths.wts_variant(TritonConfig(serial_update=update)),
                          description=f"the Triton kernel, serial update {update}")
  for kernel in ("stacked", "rows"):   # a Mosaic kernel by name, its planner's choices
    if f"wts-{kernel}" in names and f"wts-{kernel}" not in paths.PATHS:
      paths.register_path(f"wts-{kernel}", jax_paths.available_wts,
                          jax_paths.wts_variant(
                              {"stacked": MosaicStackedConfig, "rows": MosaicRowConfig}[kernel]()),
                          description=f"the Mosaic kernel {kernel!r}, its planner's choices")
  for status in ("flags", "kernel"):   # the stacked kernel's status, either form
    name = f"wts-stacked-status-{status}"
    if name in names and name not in paths.PATHS:
      paths.register_path(name, jax_paths.available_wts,
                          _stacked_status(jax_paths.prepare_wts, status),
                          description=f"wts, the stacked kernel's status={status!r}")
  for name, (patch, description) in PATCHED_WTS_PATHS.items():
    if name in names and name not in paths.PATHS:
      paths.register_path(name, jax_paths.available_wts, patch(jax_paths.prepare_wts),
                          description=description)
  for name in names:   # the gated and rnn heads' hoist GEMM split on K
    split = HOIST_SPLIT_VARIANT.match(name)
    if split and name not in paths.PATHS:
      paths.register_path(name, jax_paths.available_wts,
                          _hoist_split(jax_paths.prepare_wts, int(split.group(1))),
                          description=f"wts, the hoist's GEMM as {split.group(1)} partial "
                                      "products on K, summed after")
  for path in ("wts", "xla"):   # the harness's chain carrying only the tokens' last column
    name = f"{path}-carry-last-column"
    if name in names and name not in paths.PATHS:
      paths.register_path(name, jax_paths.available_wts if path == "wts" else
                          paths.get_path(path).available_fn,
                          _carry_last_column(paths.get_path(path).prepare_fn),
                          description=f"{path}, timed in a chain that carries the tokens' "
                                      "last column (an op of the walk's own)")
  if "wts-mb-auto" in names and "wts-mb-auto" not in paths.PATHS:
    paths.register_path("wts-mb-auto", jax_paths.available_wts,
                        jax_paths.wts_variant(MosaicBatchedConfig()),
                        description="the batched Mosaic kernel, the planner's choices")
  for widening in ("xla", "registers", "smem"):   # an int8 W2 widened before or in the kernel
    for warpgroups in (None, 2):
      name = f"wts-mb-widen-{widening}" + ("-w2" if warpgroups else "")
      if name in names and name not in paths.PATHS:
        paths.register_path(
            name, jax_paths.available_wts,
            jax_paths.wts_variant(MosaicBatchedConfig(w2_widening=widening,
                                                      warpgroups=warpgroups)),
            description=f"the batched Mosaic kernel, an int8 W2 widened ({widening})"
                        + (", two warpgroups" if warpgroups else ""))
  for name in names:
    batched = BATCHED_VARIANT.match(name)
    if batched and name not in paths.PATHS:
      register_batched(name, *batched.groups())
      continue
    match = MOSAIC_VARIANT.match(name)
    if not match or name in paths.PATHS:
      continue
    wgmma, resident, stages, group, on_chip_group, held, forward = match.groups()
    gemv = "wgmma" if wgmma else "registers"
    paths.register_path(
        name, jax_paths.available_wts,
        jax_paths.wts_variant(MosaicRowConfig(
            gemv=gemv, residency=int(resident) * 64,
            ring_stages=int(stages) or None,   # s0: nothing streamed
            group=int(group or 1), snake=not forward, register_chunks=int(held or 0),
            resident_group=int(on_chip_group) if on_chip_group else None)),
        description=f"Mosaic kernel, {gemv} GEMV, {resident} resident chunks, "
                    f"{stages}-slot ring, {group or 1} chunk(s) per WGMMA wait"
                    + (f", {held} chunks in registers" if held else "")
                    + (", forward order" if forward else ", snake order"))


def _stacked_status(prepare, status: str):
  """``prepare`` (a wts path) with the stacked kernel's ``StackedSpec.status`` set."""
  return _stacked_spec_patch(prepare, status=status)


def _stacked_spec_patch(prepare, **changes):
  """``prepare`` (a wts path) with the stacked kernel's ``StackedSpec`` fields
  ``changes`` set."""
  return _plan_patch(prepare, "mosaic_stacked_backend", "stacked.spec", "StackedSpec",
                     **changes)


def _without_joint_hidden(prepare):
  """``prepare`` (a wts path) given the head without its contiguous J_h
  (``wts_jax.with_joint_hidden``), as a head that never had it."""
  def prepared(head, *args, **kwargs):
    from flax import nnx
    serial = head.markov_head
    if getattr(serial, "joint_hidden", None) is not None:
      head = nnx.merge(*nnx.split(head))
      del head.markov_head.joint_hidden
    return prepare(head, *args, **kwargs)
  return prepared


def _without_joint_table(prepare):
  """``prepare`` (a wts path) given the rnn head without its joint table
  (``wts_jax.with_joint_table``): its update split over the blocks, as before the table."""
  def prepared(head, *args, **kwargs):
    from flax import nnx
    if getattr(head.markov_head, "joint_table", None) is not None:
      head = nnx.merge(*nnx.split(head))
      del head.markov_head.joint_table
    return prepare(head, *args, **kwargs)
  return prepared


def _batched_spec_patch(prepare, where=None, **changes):
  """``prepare`` (a wts path) with the batched kernel's ``BatchedSpec`` fields
  ``changes`` set (where ``where(spec)``, if given, holds)."""
  return _plan_patch(prepare, "mosaic_batched_backend", "batched.spec", "BatchedSpec",
                     where=where, **changes)


def _late_ring_refill(prepare):
  """``prepare`` (a wts path) with the batched kernel's streamed W2 slots refilled after
  each chunk's epilogue (the planner's choice before its 1-slot rings refilled early)."""
  return _batched_spec_patch(prepare, ring_refill="after_epilogue")


def _early_ring_refill(prepare):
  """``prepare`` (a wts path) with the batched kernel's streamed W2 slots refilled before
  each chunk's epilogue, where no int8 W2 is widened in the kernel (elsewhere as
  planned)."""
  return _batched_spec_patch(prepare, where=lambda spec: not spec.plan.widened_in_kernel,
                             ring_refill="before_epilogue")


# The modules that call the hoist's GEMM (``wts_jax.heads.base.hidden_terms``) by name.
HOIST_CALLERS = ("wts_jax.heads.markov", "wts_jax.heads.recurrent", "wts_jax.gate_table")


def split_hidden_terms(parts: int):
  """``hidden_terms`` as ``parts`` GEMMs over slices of the hidden size (a batch of
  them: ``parts`` times the CTAs of one on the H200's 132 SMs), their fp32 products
  summed after: the same products, summed in another order."""
  from wts_jax.heads.base import hidden_terms

  def terms(hidden, weight, bias):
    size = hidden.shape[-1]
    if size % parts:
      return hidden_terms(hidden, weight, bias)
    sliced = hidden.reshape(*hidden.shape[:-1], parts, size // parts)
    weights = weight.reshape(weight.shape[0], parts, size // parts)
    if hidden.dtype == weight.dtype and weight.dtype in (jnp.bfloat16, jnp.float16):
      partial = jnp.einsum("bksd,jsd->sbkj", sliced, weights,
                           preferred_element_type=jnp.float32)
    else:
      partial = jnp.einsum("bksd,jsd->sbkj", sliced.astype(jnp.float32),
                           weights.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return partial.sum(0) + bias.astype(jnp.float32)
  return terms


def _hoist_split(prepare, parts: int):
  """``prepare`` (a wts path) whose walk traces with the hoist's GEMM split on K
  (``split_hidden_terms``) in every module that calls it."""
  return _traced_with(prepare, "hidden_terms", lambda _: split_hidden_terms(parts),
                      modules=HOIST_CALLERS)


def _batched_status(prepare, status: str):
  """``prepare`` (a wts path) with the batched kernel's ``BatchedSpec.status`` set."""
  return _batched_spec_patch(prepare, status=status)


def _plan_patch(prepare, backend: str, module: str, spec_name: str, where=None,
                **changes):
  """``prepare`` (a wts path) whose kernel spec (``wts_jax.pallas.<module>.<spec_name>``)
  has the fields ``changes`` (where ``where(spec)``, if given, holds): the backend's
  ``wts_jax.pallas.<backend>.plan`` patched while this path's walk traces (the harness
  traces in one thread), so the other paths keep theirs."""
  def patched_planner(plan_of):
    import dataclasses
    import importlib
    from wts_jax.pallas.mosaic_launch import WithLogits
    spec_type = getattr(importlib.import_module(f"wts_jax.pallas.{module}"), spec_name)

    def changed(spec):
      if isinstance(spec, WithLogits):
        return dataclasses.replace(spec, inner=changed(spec.inner))
      if isinstance(spec, spec_type) and (where is None or where(spec)):
        return dataclasses.replace(spec, **changes)
      return spec
    return lambda *plan_args, **plan_kwargs: changed(plan_of(*plan_args, **plan_kwargs))
  return _traced_with(prepare, "plan", patched_planner,
                      modules=(f"wts_jax.pallas.{backend}",))


def _shallow_joint_ring(prepare):
  """``prepare`` (a wts path) with the batched planner's ring preference for the rnn
  head's joint table the split update's (``DEFAULT_RING_STAGES``: the preference before
  the joint table's deeper ring, ``docs/decisions.md``)."""
  def shallow(preference):
    from wts_jax.pallas.batched.plan import DEFAULT_RING_STAGES
    return lambda **kw: (DEFAULT_RING_STAGES if kw.get("joint_table")
                         else preference(**kw))
  return _traced_with(prepare, "auto_ring_preference", shallow)


def _deep_ring(prepare):
  """``prepare`` (a wts path) with the batched planner's ring preference the vanilla
  head's for every head (``AUTO_RING_PREFERENCE`` slots before any chunk stays resident;
  the rnn head takes ``DEFAULT_RING_STAGES``)."""
  def deep(_):
    from wts_jax.pallas.batched.auto import AUTO_RING_PREFERENCE
    return lambda **_: AUTO_RING_PREFERENCE
  return _traced_with(prepare, "auto_ring_preference", deep)


def _traced_with(prepare, name: str, replace,
                 modules=("wts_jax.pallas.mosaic_batched_backend",)):
  """``prepare`` (a wts path) whose walk traces with each module's ``<name>`` replaced by
  ``replace(original)``, restored after (the harness traces in one thread)."""
  def prepared(*args, **kwargs):
    import importlib
    from wts_jax.bench.registry import jax_prepared
    base = prepare(*args, **kwargs)
    patched = [importlib.import_module(module) for module in modules]
    originals = [getattr(module, name) for module in patched]

    def walk_fn(operands, first):
      for module, original in zip(patched, originals):
        setattr(module, name, replace(original))
      try:
        return base.walk_fn(operands, first)
      finally:
        for module, original in zip(patched, originals):
          setattr(module, name, original)
    return jax_prepared(walk_fn, base.operands, base.first_tokens,
                        traced_tokens=base.traced_tokens, notes=base.notes)
  return prepared


def _carry_last_column(prepare):
  def prepared(*args, **kwargs):
    import dataclasses
    return dataclasses.replace(prepare(*args, **kwargs), chain_carry="last_column")
  return prepared


# The wts paths of one fixed name that patch the API's walk while it traces: name →
# (the patch of ``prepare_wts``, the path's description).
PATCHED_WTS_PATHS = {
    "wts-batched-status-flags": (
        functools.partial(_batched_status, status="flags"),
        "wts, the batched kernel's status reduced after the launch"),
    "wts-ring-deep": (
        _deep_ring, "wts, the batched planner's deeper ring for the rnn head too"),
    "wts-joint-ring-shallow": (
        _shallow_joint_ring,
        "wts, the rnn joint table's ring at the split update's depth (2 slots first)"),
    "wts-rnn-sliced-j-h": (
        _without_joint_hidden,
        "wts, the rnn head's J_h sliced out of joint_proj every walk (no contiguous copy)"),
    "wts-rnn-no-joint-table": (
        _without_joint_table,
        "wts, the rnn head without its joint table (its update split, a second barrier)"),
    "wts-ring-refill-late": (
        _late_ring_refill,
        "wts, the batched kernel's W2 ring slots refilled after each chunk's epilogue"),
    "wts-ring-refill-early": (
        _early_ring_refill,
        "wts, the batched kernel's W2 ring slots refilled before each chunk's epilogue"),
    "wts-stacked-w2-rows": (
        functools.partial(_stacked_spec_patch, w2_order="rows"),
        "wts, the stacked kernel's W2 in row order"),
}


def _named_paths(argv):
  for i, arg in enumerate(argv):
    if arg == "--paths" and i + 1 < len(argv):
      return argv[i + 1].split(",")
    if arg.startswith("--paths="):
      return arg.split("=", 1)[1].split(",")
  return []


if __name__ == "__main__":
  register_variants(_named_paths(sys.argv[1:]))
  sys.exit(cli.main(sys.argv[1:]))
