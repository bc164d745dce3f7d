"""Experiment (not the library): does a Mosaic GPU persistent kernel with SMEM-resident
W2 and a semaphore grid barrier run on the H200, and what does a step cost?

132 blocks, each keeps TN rows of a bf16 W2 [132*TN, 256] in shared memory (one TMA
load), then K steps of: register GEMV over its rows, local argmax, publish to a
parity-double-buffered exchange, grid barrier (global semaphore, bounded spin), reduce
all pairs to one token, gather e = W1[token]. Times K=1 and K=7 to separate the per-step
cost. Prints tokens vs NumPy. Based on the research notes of the Mosaic GPU survey.
"""
import inspect, time
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

R = 256
WG = plgpu.Layout.WGMMA
TF = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
CH = 64
MAX_SPIN = 1 << 22
NEG = -3.0e38
_IDX_REQUIRED = inspect.signature(plgpu.load).parameters["idx"].default is inspect.Parameter.empty


def load(ref, layout=None, **kw):
  return plgpu.load(ref, (), layout=layout, **kw) if _IDX_REQUIRED else plgpu.load(ref, layout=layout, **kw)


def make(NB, TN, K, semantics):
  NBP = max(128, -(-NB // 128) * 128)
  def f(w2, base, w1, e0):
    @plgpu.kernel(
        out_type=(jax.ShapeDtypeStruct((K,), jnp.int32), jax.ShapeDtypeStruct((NB,), jnp.int32),
                  jax.ShapeDtypeStruct((2, NBP), jnp.float32), jax.ShapeDtypeStruct((2, NBP), jnp.int32)),
        grid=(NB,), grid_names=("blocks",),
        scratch_types=[plgpu.SMEM((TN, R), jnp.bfloat16, transforms=TF), plgpu.Barrier(num_arrivals=1, num_barriers=1)],
        compiler_params=plgpu.CompilerParams(lowering_semantics=semantics))
    def k(w2_g, base_g, w1_g, e0_g, tok_g, err_g, xv_g, xi_g, w_s, bar):
      pid = jax.lax.axis_index("blocks")
      row0 = pid * TN
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR(()))
      plgpu.copy_gmem_to_smem(w2_g.at[pl.ds(row0, TN)], w_s, bar)
      plgpu.barrier_wait(bar)
      err_g[pid] = jnp.int32(0)

      def step(kk, e):
        eb = jax.lax.broadcast_in_dim(e, (CH, R), (1,))
        def chunk(j, carry):
          best_v, best_i = carry
          r0 = pl.multiple_of(j * CH, CH)
          w = load(w_s.at[pl.ds(r0, CH)], layout=WG).astype(jnp.float32)
          lg = (w * eb).sum(axis=1)
          lg = lg + load(base_g.at[pl.ds(row0 + r0, CH)], layout=WG.reduce(1), optimized=False)
          m = lg.max()
          idx = plgpu.broadcasted_iota(jnp.int32, (CH,), 0, layout=WG.reduce(1))
          i = jnp.min(jnp.where(lg == m, idx, jnp.int32(2**30))) + row0 + r0
          better = m > best_v
          return jnp.where(better, m, best_v), jnp.where(better, i, best_i)
        bv, bi = jax.lax.fori_loop(0, TN // CH, chunk, (jnp.float32(NEG), jnp.int32(0)))
        slot = kk % 2
        xv_g[slot, pid] = bv
        xi_g[slot, pid] = bi
        plgpu.semaphore_signal(sem, 1, memory_scope="gpu")
        target = NB * (kk + 1)
        def cond(c):
          it, v = c
          return jnp.logical_and(v < target, it < MAX_SPIN)
        def body(c):
          it, _ = c
          return it + 1, pl.semaphore_read(sem)
        _, seen = jax.lax.while_loop(cond, body, (jnp.int32(0), pl.semaphore_read(sem)))
        @pl.when(seen < target)
        def _():
          err_g[pid] = jnp.int32(1)
        vals = load(xv_g.at[slot], layout=WG.reduce(1), optimized=False)
        ids = load(xi_g.at[slot], layout=WG.reduce(1), optimized=False)
        lane = plgpu.broadcasted_iota(jnp.int32, (NBP,), 0, layout=WG.reduce(1))
        vals = jnp.where(lane < NB, vals, jnp.float32(NEG))
        gmax = vals.max()
        tok = jnp.min(jnp.where(vals == gmax, ids, jnp.int32(2**30)))
        @pl.when(pid == 0)
        def _():
          tok_g[kk] = tok
        return load(w1_g.at[tok], layout=WG.reduce(0), optimized=False)

      e0 = load(e0_g, layout=WG.reduce(0), optimized=False)
      jax.lax.fori_loop(0, K, step, e0)
    return k(w2, base, w1, e0)
  return f


def reference(w2, base, w1, e0, K):
  w2 = np.asarray(w2.astype(jnp.float32), np.float64); e = np.asarray(e0, np.float64); out = []
  base = np.asarray(base, np.float64); w1 = np.asarray(w1, np.float64)
  for _ in range(K):
    t = int(np.argmax(w2 @ e + base)); out.append(t); e = w1[t]
  return out


def timeit(fn, args, n=50):
  out = fn(*args); jax.block_until_ready(out)
  t = time.perf_counter()
  for _ in range(n):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - t) / n * 1e6


def main():
  NB, TN = jax.devices()[0].core_count, 384
  V = NB * TN
  keys = jax.random.split(jax.random.key(0), 4)
  w2 = jax.random.normal(keys[0], (V, R), jnp.float32).astype(jnp.bfloat16) * 0.06
  base = jax.random.normal(keys[1], (V,), jnp.float32)
  w1 = jax.random.normal(keys[2], (V, R), jnp.float32)
  e0 = jax.random.normal(keys[3], (R,), jnp.float32)
  for name in ("Lane", "Warpgroup"):
    semantics = getattr(plgpu.LoweringSemantics, name)
    try:
      f7 = jax.jit(make(NB, TN, 7, semantics)); f1 = jax.jit(make(NB, TN, 1, semantics))
      toks, err, _, _ = f7(w2, base, w1, e0)
      want = reference(w2, base, w1, e0, 7)
      ok = list(np.asarray(toks)) == want and not np.asarray(err).any()
      t7, t1 = timeit(f7, (w2, base, w1, e0)), timeit(f1, (w2, base, w1, e0))
      print(f"MGPU {name}: tokens {'OK' if ok else 'WRONG'} {list(np.asarray(toks))} vs {want} "
            f"err={int(np.asarray(err).sum())}; K=7 {t7:.1f} us, K=1 {t1:.1f} us, "
            f"per extra step {(t7 - t1) / 6:.2f} us (host-timed, {TN} resident rows/block)")
    except Exception as exc:  # report and go on
      print(f"MGPU {name}: FAILED {type(exc).__name__}: {str(exc)[-1500:]}")


if __name__ == "__main__":
  main()
