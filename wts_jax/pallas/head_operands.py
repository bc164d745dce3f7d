"""From a head to the kernels' operands: one function, one hook per head type.

``serial_operands(head, hidden)`` gives every backend the same named arrays: the walk's
weights (``w2``, its per-row ``w2_scale`` when quantized, ``w1``, W1's int8 planes
``w1_planes`` / ``w1_plane_scale`` when z meets an int8 W2 as two planes, and
``w1_fragments``, the planes in the stacked walk's load order, and ``w2_thread_rows``,
W2 in its threads' row order, when the head holds it) and what the head's
own hook adds — the head's serial weights and its hidden-only terms for all K positions
at once (``SerialHead.hoist``, the same function the reference runs, computed before the
serial loop). A new head type adds its hook here and one per kernel (the kernel's
``advance``: the Triton kernel's ``ShardStep.advance`` and ``publish_serial``, the
Mosaic kernel's ``gated_z``); a backend without a hook for it refuses it in ``plan``
(``mosaic_row_backend.HEAD_TYPES``).
"""

from __future__ import annotations

from wts_jax.gate_table import hoisted_terms, table_of
from wts_jax.joint_table import joint_table_of


def _vanilla(serial, hidden) -> dict:
  del serial, hidden   # z = e: nothing but W1 and W2
  return {}


def _gated(serial, hidden) -> dict:
  # z = σ(G_h h + G_e e + b) ⊙ e: the hidden side hoisted, G_e read per step — or, where
  # the head has its gate table (``wts_jax.gate_table``), G_e e gathered with e.
  table = table_of(serial)
  operands = {"gate_hoisted": (serial.hoist(hidden) if table is None
                               else hoisted_terms(serial, hidden)),
              "gate_weight": serial.gate_proj.weight[...]}
  if table is not None:
    operands["gate_rows"] = table
  return operands


def _rnn(serial, hidden) -> dict:
  # The recurrent state's joint projection: the hidden side hoisted, J_s, J_e per step —
  # or, where the head has its joint table (``wts_jax.joint_table``), J_e e gathered.
  operands = {"joint_hoisted": serial.hoist(hidden),
              "joint_weight": serial.joint_proj.weight[...]}
  table = joint_table_of(serial)
  if table is not None:
    operands["joint_rows"] = table
  return operands


HEAD_HOOKS = {"vanilla": _vanilla, "gated": _gated, "rnn": _rnn}


def serial_operands(head, hidden) -> dict:
  """The named operands of ``head``'s serial walk (see the module docstring)."""
  serial = head.markov_head
  w2 = serial.markov_w2
  scale = getattr(w2, "scale", None)
  operands = {"w2": w2.weight[...], "w1": serial.markov_w1.weight[...]}
  if scale is not None:
    operands["w2_scale"] = scale[...]
  if serial.z_as_int8_planes:
    planes = serial.markov_w1_planes
    operands["w1_planes"], operands["w1_plane_scale"] = planes.planes[...], planes.scale[...]
    operands["w1_fragments"] = planes.fragments[...]
    if hasattr(w2, "thread_rows"):
      operands["w2_thread_rows"] = w2.thread_rows[...]
  operands.update(HEAD_HOOKS[head.config.head_type](serial, hidden))
  return operands
