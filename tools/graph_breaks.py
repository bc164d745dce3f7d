"""A patch for one device experiment (issue 52): the decode loop's CUDA graphs broken
inside the target's and the drafter's forwards, so that the host's launch of one piece
overlaps the GPU's run of the one before it.

Why: in a profiled ``generate`` the host's ``cuGraphLaunch`` takes 2-3 µs a node (on an
H100 at B = 1 a median 1.04-1.38 ms for the verify pass's graph of 495 nodes, 0.20-0.28 ms
for the drafter's of 78; docs/decisions.md, "No custom calls in command buffers"), and a graph's
kernels start only as its launch returns. So after each read of the loop's condition
the GPU waits out the first graph's launch, and it waits again wherever the verify
pass's launch outlasts the drafter and the walk. A Mosaic GPU custom call stays outside
XLA's command buffers (``launch_options.KERNEL_COMPILER_OPTIONS``), so one placed after
a layer (the device clock's stamp, through an optimization barrier:
``device_clock.stamp_between``) ends a graph there.

``install("17/1")`` breaks the target's forward after layer 17 and the drafter's after
its layer 1 (lists: "8,17,26/0,2"; either side may be empty): the drafter's first piece
(about 28 kernels) launches in ≈ 60 µs, and each later piece launches while the GPU runs
the one before (the verify pass's halves, about 220 and 265 kernels, launch in ≈ 0.5 ms
each, against the drafter's and the walk's ≈ 0.8 ms and the first half's ≈ 1.7 ms on an
H100 at B = 1). It patches the two modules' ``finish_layer`` and must run before the
loop is compiled. Used by ``SECTIONS=breaks`` of ``tools/e2e_session.sh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402

from wts_jax.pallas import device_clock  # noqa: E402
from wts_jax.specdecode import dspark, qwen3  # noqa: E402


def parse(spec: str) -> tuple[frozenset[int], frozenset[int]]:
  """"TARGET/DRAFTER" layer lists → (target layers, drafter layers)."""
  target, _, drafter = spec.partition("/")
  def layers(text):
    return frozenset(int(x) for x in text.split(",") if x.strip())
  return layers(target), layers(drafter)


def with_breaks(finish_layer, after: frozenset[int]):
  """``finish_layer`` that, after the layers in ``after``, passes its output through a
  device-clock stamp. A forward calls it for its layers in order, each trace all of
  them, so the layer is the count of calls at the config's depth modulo that depth (a
  count per depth, should models of other depths pass through the same function)."""
  calls: dict[int, int] = {}
  def finish(h, attended, layer, c):
    if after and max(after) >= c.num_layers:
      raise ValueError(f"a graph break after layer {max(after)}: the model has "
                       f"{c.num_layers} layers")
    index = calls.get(c.num_layers, 0) % c.num_layers
    calls[c.num_layers] = calls.get(c.num_layers, 0) + 1
    h = finish_layer(h, attended, layer, c)
    if index in after:
      h, now = device_clock.stamp_between(h)
      # The stamp must be used, or XLA drops it: zero times the timer (a float product
      # with zero is not folded: it would be NaN for an infinite operand) added to h.
      h = h + (now[0].astype(jnp.float32) * 0.0).astype(h.dtype)
    return h
  return finish


def install(spec: str) -> None:
  target, drafter = parse(spec)
  qwen3.finish_layer = with_breaks(qwen3.finish_layer, target)
  dspark.finish_layer = with_breaks(dspark.finish_layer, drafter)


if __name__ == "__main__":
  print(parse(sys.argv[1] if len(sys.argv) > 1 else "17/1"))
