"""The paths the benchmark compares: a registry of named ways to run one walk.

A path has ``available() -> str | None`` (None: it can run here; else why it is skipped)
and ``prepare(head, base_logits, first_tokens, hidden, mode, *, return_logits=False)
-> Prepared``. ``mode`` is a ``BenchMode`` (greedy, or Gumbel-max sampling at
``temperature`` with ``key``); ``mode.sampling(batch)`` gives the
``validation.Sampling`` that the walks take. ``prepare`` may raise ``SkipPath`` when
it cannot run one point (a shape its kernel does not support).

A ``Prepared`` walk has ``run()`` (launch one walk asynchronously and return its device
outputs) and ``tokens(outputs) -> np.ndarray [B, K]``. JAX paths also give
``walk_fn(operands, first_tokens)``, a traceable walk over explicit operands, which the
timing chains N times in one executable (``timing.build_chain``); the harness compiles
that chain ahead and checks the tokens of its first run, so it never calls a JAX path's
``run()``. A path's ``framework`` ("jax" or "torch") says when the harness prepares it:
JAX paths before the point's compilation (``prepare`` must not launch device work), the
others after it, just before they are checked and timed.

Adding a path takes a few lines::

    def prepare_mine(head, base_logits, first_tokens, hidden, mode, *, return_logits=False):
      def walk_fn(operands, first):
        head, base, hidden, key = operands
        return my_walk(head, base, first, hidden, mode.sampling(base.shape[0], key))
      return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)

    register_path("mine", lambda: None, prepare_mine)
"""

from __future__ import annotations

from wts_jax.bench import jax_paths, sharded_paths, torch_paths
from wts_jax.bench.registry import (PATHS, BenchMode, Path, Prepared, SkipPath,
                                    get_path, jax_prepared, register_path,
                                    unregister_path)

__all__ = ["DEFAULT_PATHS", "PATHS", "BenchMode", "Path", "Prepared", "SkipPath",
           "get_path", "jax_prepared", "register_path", "unregister_path"]

register_path("xla", lambda: None, jax_paths.prepare_xla,
              description="jitted step-wise reference walk (lax.scan over K)")
register_path("pallas-stepwise", jax_paths.available_pallas_stepwise,
              jax_paths.prepare_pallas_stepwise,
              description="one fused Pallas kernel per step")
register_path("torch-eager", torch_paths.available_torch_eager,
              torch_paths.prepare_torch_eager,
              description="DeepSpec's PyTorch loop, eager", framework="torch")
register_path("torch-graph", torch_paths.available_torch_graph,
              torch_paths.prepare_torch_graph,
              description="DeepSpec's PyTorch loop captured as one CUDA graph",
              framework="torch")
register_path("wts", jax_paths.available_wts, jax_paths.prepare_wts,
              description="the persistent Weights-That-Stay kernel (walk(impl='pallas'))")

register_path("sharded-stepwise", sharded_paths.available_sharded,
              sharded_paths.prepare_sharded_stepwise,
              description="the XLA walk split along V over every GPU of the host, one "
                          "all_gather of the step's candidates a step")
register_path("sharded-step-kernel", sharded_paths.available_sharded,
              sharded_paths.prepare_sharded_step_kernel,
              description="split along V over every GPU, one Pallas step kernel a step "
                          "on each, the exchange between launches")

DEFAULT_PATHS = ("xla", "pallas-stepwise", "torch-eager", "torch-graph", "wts")
