"""A head's derived copies: arrays it holds only so that a kernel reads them faster, each
a function of weights the head also holds.

- ``markov_w2.thread_rows``: an int8-planes W2's rows in the stacked walk's thread order
  (``quantize_w2(..., state="planes")``), from ``markov_w2.weight``;
- ``markov_w1_planes`` (``planes``, ``scale``, ``fragments``): W1 as two int8 planes,
  from ``markov_w1.weight`` (the same);
- ``gate_table`` (``rows``, ``hidden_weight``): the gated head's gate table
  (``with_gate_table``), from ``markov_w1.weight`` and ``gate_proj.weight``;
- ``joint_hidden.weight``: the rnn head's contiguous J_h (``with_joint_hidden``), from
  ``joint_proj.weight``;
- ``joint_table.rows``: the rnn head's joint table (``with_joint_table``), from
  ``markov_w1.weight`` and ``joint_proj.weight``.

Nothing rebuilds them when a weight is changed in place (say after a fine-tuning step),
and a walk reads the copy, so a stale copy gives other tokens than the weights it sits
beside. ``stale_copies(head)`` names the stale ones (each rebuilt and compared bit for
bit: one pass over the weights); ``with_fresh_copies(head)`` gives a head sharing every
weight, with every derived copy rebuilt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax.gate_table import GateTable
from wts_jax.heads.base import sharing_copy
from wts_jax.heads.recurrent import JointHidden
from wts_jax.int8_state import thread_rows_ordered
from wts_jax.joint_table import JointTable
from wts_jax.quantize import W1Planes


def _fresh(serial) -> dict[str, dict[str, jax.Array]]:
  """{copy's path: {field: the array its sources give now}} for each derived copy the
  serial head holds, each built as the function that first made it builds it."""
  def fields(module, names):
    return {name: getattr(module, name)[...] for name in names}
  copies = {}
  w2 = serial.markov_w2
  if hasattr(w2, "thread_rows"):
    copies["markov_w2"] = {"thread_rows": thread_rows_ordered(w2.weight[...])}
  if getattr(serial, "markov_w1_planes", None) is not None:
    copies["markov_w1_planes"] = fields(W1Planes(serial.markov_w1.weight[...]),
                                        ("planes", "scale", "fragments"))
  if getattr(serial, "gate_table", None) is not None:
    copies["gate_table"] = fields(GateTable.of(serial), ("rows", "hidden_weight"))
  if getattr(serial, "joint_hidden", None) is not None:
    copies["joint_hidden"] = fields(JointHidden.of(serial), ("weight",))
  if getattr(serial, "joint_table", None) is not None:
    copies["joint_table"] = fields(JointTable.of(serial), ("rows",))
  return copies


def _same_bits(held: jax.Array, fresh: jax.Array) -> bool:
  held, fresh = np.asarray(held), np.asarray(fresh)
  if held.shape != fresh.shape or held.dtype != fresh.dtype:
    return False
  return held.tobytes() == fresh.tobytes()


def stale_copies(head) -> list[str]:
  """The derived copies of ``head`` (``markov_head.<copy>.<field>``) that differ, bit for
  bit, from what their sources give now; [] when every one is current (or there is
  none)."""
  serial = head.markov_head
  return [f"markov_head.{copy}.{field}"
          for copy, fields in _fresh(serial).items()
          for field, array in fields.items()
          if not _same_bits(getattr(getattr(serial, copy), field)[...], array)]


def with_fresh_copies(head):
  """A head sharing every weight with ``head``, with each derived copy it holds rebuilt
  from the weights as they are now (the input head is left as it was)."""
  copied = sharing_copy(head)
  serial = copied.markov_head
  for copy, fields in _fresh(serial).items():
    module = getattr(serial, copy)
    for field, array in fields.items():
      # (New variables: the merged head's would be the input head's own.)
      setattr(module, field, nnx.Variable(jnp.asarray(array)))
  return copied
