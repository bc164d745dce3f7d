"""The vocabulary-sharded walk (``wts_jax.sharded``) on CPU host devices: on 1-D and 2-D
meshes, every head, greedy and sampled, B from 1 to 8, W1 split or whole, bf16 / int8 /
fp8 W2, it gives the one-device walk's tokens bit for bit (and its logits, confidence and
log-probabilities); its compiled program moves nothing V-sized between devices.

The conftest gives the CPU client 8 devices; single-device tests keep running on the
first one as before.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import wts_jax
from sharded_checks import (MESHES, NEEDS_8_DEVICES, assert_nothing_vocab_sized_moves,
                            assert_same_walk, make_mesh, temperatures)
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.quantize import quantize_w2
from wts_jax.sharded.placement import place_head

pytestmark = NEEDS_8_DEVICES

VOCAB, RANK, HIDDEN, STEPS = 512, 16, 24, 5


def _case(head_type, batch, seed=0, confidence=True):
  config = HeadConfig(vocab_size=VOCAB, rank=RANK, hidden_size=HIDDEN, head_type=head_type,
                      confidence=confidence)
  head = wts_jax.make_head(config, seed=seed)
  return head, random_inputs(config, batch, STEPS, jax.random.key(seed + 1))


def _on_mesh(mesh_name, head, base, split_w1=True, explicit=True):
  _, _, vocab_axis, batch_axis = MESHES[mesh_name]
  mesh = make_mesh(mesh_name, explicit)
  placed = place_head(head, mesh, vocab_axis, split_w1=split_w1)
  base = jax.device_put(base, NamedSharding(mesh, P(batch_axis, None, vocab_axis)))
  return mesh, placed, base


def _walk_both(head, inputs, mesh_name, temperature, split_w1=True, **kwargs):
  base, first, hidden = inputs
  key = jax.random.key(7)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key, **kwargs)
  _, placed, sharded_base = _on_mesh(mesh_name, head, base, split_w1)
  out = wts_jax.walk(placed, sharded_base, first, hidden, temperature=temperature, key=key,
                     **kwargs)
  return out, ref


MESH_BATCHES = [("tensor2", 1), ("tensor4", 8), ("data2_tensor4", 2),
                ("data2_tensor4", 8), ("vocab_over_x2_y4", 3)]


@pytest.mark.parametrize("mesh_name,batch", MESH_BATCHES)
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_sharded_walk_is_the_one_device_walk(mesh_name, batch, head_type, sampled):
  head, inputs = _case(head_type, batch, seed=batch)
  # W1 split along V on the 1-D meshes, whole on the 2-D ones: both exchanges.
  split_w1 = len(MESHES[mesh_name][0]) == 1
  out, ref = _walk_both(head, inputs, mesh_name, temperatures(batch, sampled), split_w1,
                        return_logits=True, return_logprobs=True)
  assert_same_walk(out, ref)
  _, _, vocab_axis, batch_axis = MESHES[mesh_name]
  assert out.logits.sharding.spec == P(batch_axis, None, vocab_axis)  # left where it is


@pytest.mark.parametrize("scheme,state", [("int8", "float"), ("int8", "planes"),
                                          ("fp8", "float")])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_quantized_w2_sharded(scheme, state, sampled):
  head, inputs = _case("gated", 4, seed=3)
  head = quantize_w2(head, scheme, state=state)
  out, ref = _walk_both(head, inputs, "tensor4", temperatures(4, sampled),
                        return_logits=True)
  assert_same_walk(out, ref)


def test_ties_across_devices_go_to_the_lowest_column():
  """Equal best scores on several devices: the lowest global column wins, as one
  device's argmax chooses; and a NaN wins where there is one (reported in the status)."""
  head, (base, first, hidden) = _case("vanilla", 3, confidence=False)
  # W2 = 0: the logits are the base logits, with the maximum planted on several devices
  # (V = 512 over 4 devices: 128 columns each).
  zero = wts_jax.heads.base.sharing_copy(head)
  from flax import nnx
  zero.markov_head.markov_w2.weight = nnx.Param(
      jnp.zeros_like(head.markov_head.markov_w2.weight[...]))
  base = jnp.asarray(base, jnp.float32)
  base = base.at[0, :, jnp.array([40, 300, 500])].set(20.0)     # devices 0, 2, 3
  base = base.at[1, :, jnp.array([130, 129])].set(20.0)         # both on device 1
  out, ref = _walk_both(zero, (base, first, hidden), "tensor4", 0.0)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.tokens[0, 0]) == 40 and int(out.tokens[1, 0]) == 129

  with_nan = base.at[2, 0, jnp.array([200, 450])].set(jnp.array([20.0, jnp.nan]))
  _, placed, sharded_base = _on_mesh("tensor4", zero, with_nan)
  out = jax.jit(wts_jax.walk)(placed, sharded_base, first)
  ref = jax.jit(functools.partial(wts_jax.walk, impl="xla"))(zero, with_nan, first)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.tokens[2, 0]) == 450
  assert int(out.status) == int(ref.status) == wts_jax.output.STATUS_NAN_LOGITS


def test_sampled_noise_is_drawn_by_global_column():
  """The same key gives the same sampled tokens on 2, 4 and 8 devices (the noise of a
  column does not depend on which device holds it)."""
  head, inputs = _case("rnn", 2, seed=5)
  tokens = []
  for mesh_name in ("tensor2", "tensor4", "vocab_over_x2_y4"):
    out, ref = _walk_both(head, inputs, mesh_name, 1.5)
    tokens.append(np.asarray(out.tokens))
  np.testing.assert_array_equal(tokens[0], np.asarray(ref.tokens))
  for other in tokens[1:]:
    np.testing.assert_array_equal(other, tokens[0])


def test_inside_shard_map_with_an_axis_name():
  """Inside the caller's shard_map the arrays are each device's; ``vocab_axis`` names
  the axis (W1 whole here: its row count tells)."""
  head, (base, first, hidden) = _case("gated", 4, seed=2)
  mesh = make_mesh("tensor4", explicit=False)
  placed = place_head(head, mesh, "tensor", split_w1=False)
  leaves, treedef = jax.tree.flatten(placed)
  specs = jax.tree.unflatten(treedef, [leaf.sharding.spec for leaf in leaves])
  key = jax.random.key(11)

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(specs, P(None, None, "tensor"),
                                                         P(), P()),
                     out_specs=(P(), P(None, None, "tensor")), check_vma=False)
  def engine_step(head, base, first, hidden):
    out = wts_jax.walk(head, base, first, hidden, temperature=0.8, key=key,
                       vocab_axis="tensor", return_logits=True)
    return out.tokens, out.logits

  tokens, logits = engine_step(placed, base, first, hidden)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=0.8, key=key,
                     return_logits=True)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref.logits), atol=1e-6)


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit_axes", "auto_axes"])
def test_under_jit(explicit):
  """Under jit: on explicit mesh axes the arrays' types tell the layout; on automatic
  axes ``vocab_axis`` and ``mesh`` do."""
  head, (base, first, hidden) = _case("vanilla", 2, seed=4)
  mesh, placed, sharded_base = _on_mesh("tensor2", head, base, explicit=explicit)
  where = {} if explicit else {"vocab_axis": "tensor", "mesh": mesh}
  walk = jax.jit(lambda h, b, f, hd: wts_jax.walk(h, b, f, hd, **where).tokens)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(walk(placed, sharded_base, first, hidden)),
                                np.asarray(ref.tokens))


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit_axes", "auto_axes"])
def test_a_step_without_a_finite_logit_sets_the_status_bit(explicit):
  """As on one device: a step whose logits are all -Inf is reported, not walked to
  token 0 with a clean status (asked by a max over the split V, not a gather)."""
  head, (base, first, hidden) = _case("vanilla", 2, seed=5)
  bad = base.at[1, 3, :].set(-jnp.inf)
  mesh, placed, sharded_bad = _on_mesh("tensor2", head, bad, explicit=explicit)
  where = {} if explicit else {"vocab_axis": "tensor", "mesh": mesh}
  walk = jax.jit(lambda b: wts_jax.walk(placed, b, first, hidden, **where).status)
  assert int(walk(sharded_bad)) == wts_jax.output.STATUS_NO_FINITE_LOGIT
  _, _, sharded_base = _on_mesh("tensor2", head, base, explicit=explicit)
  assert int(walk(sharded_base)) == 0


@pytest.mark.parametrize("mesh_name,split_w1,explicit",
                         [("tensor4", True, True), ("tensor4", False, False),
                          ("data2_tensor4", True, False),
                          ("vocab_over_x2_y4", False, True)])
@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_compiled_walk_moves_nothing_vocab_sized(mesh_name, split_w1, explicit, head_type):
  """The compiled program's collectives: the step's packed candidates (and W1 rows where
  W1 is split), never a V-sized array — W2, W1, the base logits and the logits stay
  where they lie."""
  batch = 4
  head, (base, first, hidden) = _case(head_type, batch)
  mesh, placed, sharded_base = _on_mesh(mesh_name, head, base, split_w1, explicit)
  shape, _, vocab_axis, batch_axis = MESHES[mesh_name]
  where = {} if explicit else {"vocab_axis": vocab_axis, "batch_axis": batch_axis,
                               "mesh": mesh}

  def run(h, b, f, hd):
    out = wts_jax.walk(h, b, f, hd, temperature=0.9, key=jax.random.key(0),
                       return_logits=True, return_logprobs=True, **where)
    return out.tokens, out.logits, out.logprobs

  text = jax.jit(run).lower(placed, sharded_base, first, hidden).compile().as_text()
  shards = int(np.prod([mesh.shape[name] for name in
                        ((vocab_axis,) if isinstance(vocab_axis, str) else vocab_axis)]))
  # A step's message per device: score, index, chosen, lse and (W1 split) half-words of
  # the bf16 W1 row; gathered from every device of the vocabulary axis. On automatic
  # axes a traced W1's layout is not visible: the walk takes it as split (a whole W1 is
  # then sliced where it lies; taken as whole, a split one would be gathered).
  rows_travel = split_w1 or not explicit
  words = 4 + (RANK // 2 if rows_travel else 0)
  assert_nothing_vocab_sized_moves(text, VOCAB, shards, shards * batch * (words + 4))


def test_engine_layout_head_sharded_without_a_copy():
  """A head over an engine's arrays (W2 as a Linear kernel [r, V] split along V, W1
  whole, as sglang-jax holds them): walked where they lie, the one-device walk's tokens."""
  from wts_jax.heads.engine import head_from_arrays
  head, (base, first, hidden) = _case("gated", 4, seed=6)
  serial = head.markov_head
  mesh = make_mesh("tensor4")
  w1 = jax.device_put(serial.markov_w1.weight[...], NamedSharding(mesh, P()))
  w2_kernel = jax.device_put(serial.markov_w2.weight[...].T, NamedSharding(mesh,
                                                                          P(None, "tensor")))
  whole = NamedSharding(mesh, P())
  engine_head = head_from_arrays(
      w1, w2_kernel,
      gate_kernel=jax.device_put(serial.gate_proj.weight[...].T, whole),
      gate_bias=jax.device_put(serial.gate_proj.bias[...], whole),
      confidence_kernel=jax.device_put(head.confidence_head.proj.weight[...].T, whole),
      confidence_bias=jax.device_put(head.confidence_head.proj.bias[...], whole))
  # The head holds the caller's arrays themselves.
  assert engine_head.markov_head.markov_w2.kernel[...] is w2_kernel
  assert engine_head.markov_head.markov_w1.weight[...] is w1
  sharded_base = jax.device_put(base, NamedSharding(mesh, P(None, None, "tensor")))
  for temperature in (0.0, 1.1):
    key = jax.random.key(2)
    out = wts_jax.walk(engine_head, sharded_base, first, hidden, temperature=temperature,
                       key=key, return_logprobs=True)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                       key=key, return_logprobs=True)
    assert_same_walk(out, ref)


def test_an_axis_of_one_device_is_the_one_device_walk():
  head, (base, first, hidden) = _case("vanilla", 2)
  mesh = jax.make_mesh((1,), ("tensor",), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,))
  placed = place_head(head, mesh, "tensor")
  from wts_jax import sharded
  assert sharded.placement(placed, base) is None
  out = wts_jax.walk(placed, base, first, hidden, impl="xla")
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


# --- refusals: one line naming the value -----------------------------------------------

def test_refusals_name_the_value():
  head, (base, first, hidden) = _case("vanilla", 3)
  mesh, placed, sharded_base = _on_mesh("tensor4", head, base)
  with pytest.raises(ValueError, match="impl='mosaic' cannot run a vocabulary-sharded"):
    wts_jax.walk(placed, sharded_base, first, hidden, impl="mosaic")
  assert wts_jax.chosen_implementation(placed, sharded_base) == "xla"
  assert wts_jax.chosen_implementation(placed, sharded_base, "pallas") == "pallas"
  with pytest.raises(ValueError, match="impl='triton' cannot run a vocabulary-sharded"):
    wts_jax.chosen_implementation(placed, sharded_base, "triton")
  with pytest.raises(ValueError, match="no axis \\['vocab'\\] in the mesh"):
    wts_jax.walk(head, base, first, hidden, vocab_axis="vocab", mesh=mesh)
  with pytest.raises(ValueError, match="batch B=3 is not a multiple of the 2 devices"):
    wts_jax.walk(head, base, first, hidden, vocab_axis="tensor", batch_axis="data",
                 mesh=make_mesh("data2_tensor4"))
  config = HeadConfig(vocab_size=510, rank=RANK, hidden_size=HIDDEN)
  odd = wts_jax.make_head(config)
  odd_base, odd_first, _ = random_inputs(config, 2, 3, jax.random.key(0))
  with pytest.raises(ValueError, match="vocab_size=510 is not a multiple of the 4 devices"):
    wts_jax.walk(odd, odd_base, odd_first, vocab_axis="tensor", mesh=mesh)
  from flax import nnx
  along_rank = wts_jax.heads.base.sharing_copy(placed)
  along_rank.markov_head.markov_w1.weight = nnx.Param(jax.device_put(
      head.markov_head.markov_w1.weight[...], NamedSharding(mesh, P(None, "tensor"))))
  with pytest.raises(ValueError, match="markov_w1.weight is sharded as .* \\(along r\\)"):
    wts_jax.walk(along_rank, sharded_base, first, hidden)


def test_engine_layout_head_refuses_the_row_kernels_by_name():
  from wts_jax.heads.engine import head_from_arrays
  head, (base, first, hidden) = _case("vanilla", 2, confidence=False)
  engine_head = head_from_arrays(head.markov_head.markov_w1.weight[...],
                                 head.markov_head.markov_w2.weight[...].T, hidden_size=HIDDEN)
  with pytest.raises(ValueError, match="holds W2 as a Linear kernel \\[r, V\\]"):
    wts_jax.walk(engine_head, base, first, impl="mosaic")
  out = wts_jax.walk(engine_head, base, first)          # auto: the XLA walk, in place
  ref = wts_jax.walk(head, base, first, impl="xla")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert wts_jax.chosen_implementation(engine_head, base) == "xla"


# --- the sharded step kernel (impl="pallas"), in Pallas interpret mode -----------------

def _interpret_config():
  from wts_jax.sharded.step_kernel import StepKernelConfig
  return StepKernelConfig(tile_rows=32, interpret=True)


STEP_KERNEL_CASES = [("vanilla", "tensor2", 1, None), ("gated", "tensor4", 3, None),
                     ("rnn", "data2_tensor4", 8, None), ("gated", "tensor2", 4, "int8"),
                     ("vanilla", "vocab_over_x2_y4", 2, "fp8")]


@pytest.mark.parametrize("head_type,mesh_name,batch,scheme", STEP_KERNEL_CASES)
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_step_kernel_sharded_walk(head_type, mesh_name, batch, scheme, sampled):
  """One kernel launch a step on each device, the exchange between launches: the XLA
  walk's tokens, logits to the kernels' fp32-product tolerance."""
  head, (base, first, hidden) = _case(head_type, batch, seed=batch)
  if scheme:
    head = quantize_w2(head, scheme)
  temperature = temperatures(batch, sampled)
  key = jax.random.key(9)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key, return_logits=True, return_logprobs=True)
  _, placed, sharded_base = _on_mesh(mesh_name, head, base)
  out = wts_jax.walk(placed, sharded_base, first, hidden, impl="pallas",
                     config=_interpret_config(), temperature=temperature, key=key,
                     return_logits=True, return_logprobs=True)
  assert_same_walk(out, ref, logits_atol=2e-4, logprobs_atol=2e-4)


def test_step_kernel_reads_an_engine_kernel_where_it_lies():
  from wts_jax.heads.engine import head_from_arrays
  head, (base, first, hidden) = _case("vanilla", 2, confidence=False)
  mesh = make_mesh("tensor4")
  engine_head = head_from_arrays(
      jax.device_put(head.markov_head.markov_w1.weight[...], NamedSharding(mesh, P())),
      jax.device_put(head.markov_head.markov_w2.weight[...].T,
                     NamedSharding(mesh, P(None, "tensor"))), hidden_size=HIDDEN)
  sharded_base = jax.device_put(base, NamedSharding(mesh, P(None, None, "tensor")))
  out = wts_jax.walk(engine_head, sharded_base, first, impl="pallas",
                     config=_interpret_config(), temperature=0.6, key=jax.random.key(1))
  ref = wts_jax.walk(head, base, first, impl="xla", temperature=0.6, key=jax.random.key(1))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_step_kernel_refuses_int8_planes_by_name():
  head, (base, first, hidden) = _case("vanilla", 2)
  head = quantize_w2(head, "int8", state="planes")
  _, placed, sharded_base = _on_mesh("tensor2", head, base)
  with pytest.raises(ValueError, match="meets it as two int8 planes"):
    wts_jax.walk(placed, sharded_base, first, hidden, impl="pallas",
                 config=_interpret_config())


@pytest.mark.parametrize("batch,sampled,kernel_layout", [(1, False, False),
                                                         (16, True, False),
                                                         (64, False, True)])
def test_step_kernel_lowers_for_cuda_at_the_qwen3_shape(batch, sampled, kernel_layout):
  """Half of the Qwen3 vocabulary a device (two GPUs), r = 256: the Triton kernel
  lowers for CUDA (its MLIR verified), W2 by rows or as an engine's kernel."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import cuda_target, verify_triton_modules
  from wts_jax.pallas.plan import padded_batch
  from wts_jax.sharded import step_kernel
  local_vocab, rank, padded = 151_936 // 2, 256, padded_batch(batch)
  shape = step_kernel.KernelShape(
      batch=batch, padded_batch=padded, local_vocab=local_vocab, rank=rank,
      tile_rows=128, quantized=False, w2_kernel_layout=kernel_layout,
      z_exact_in_bf16=batch == 1, greedy=not sampled, return_logits=sampled,
      return_logprobs=True, num_warps=4, interpret=False)
  spec = jax.ShapeDtypeStruct
  inputs = {"z": spec((padded, rank), jnp.float32),
            "w2": spec((rank, local_vocab) if kernel_layout else (local_vocab, rank),
                       jnp.bfloat16),
            "base_logits": spec((batch, 7, local_vocab), jnp.bfloat16),
            "step": spec((1,), jnp.int32), "column_offset": spec((1,), jnp.int32)}
  if sampled:
    inputs.update(streams=spec((padded,), jnp.uint32), score_scale=spec((padded,),
                                                                         jnp.float32),
                  noise_on=spec((padded,), jnp.int32))
  verify_triton_modules()
  with cuda_target():
    text = step_kernel._launch.trace(inputs, shape=shape).lower(
        lowering_platforms=("cuda",)).as_text()
  assert text.count(step_kernel.KERNEL_NAME) >= 1
