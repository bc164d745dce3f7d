"""wts-bench's sharded paths: they refuse with one device and say why; on host devices
(the CPU client's 8) the harness places its first tokens and flush buffer on the path's
mesh, checks the sharded walk's tokens against the reference and times it; the floor
of a sharded record is one device's share plus the exchange term."""

import contextlib
import functools
import io
import json

import jax
import pytest

from sharded_checks import NEEDS_8_DEVICES
from wts_jax.bench import cli, floor, paths, sharded_paths


def test_sharded_paths_refuse_clearly_with_one_device():
  for name in ("sharded-stepwise", "sharded-step-kernel"):
    reason = paths.get_path(name).available()
    assert reason is not None and "needs 2 or more GPUs on one host" in reason, reason


def test_sharded_floor_is_one_devices_share_plus_the_exchange():
  ceilings = floor.Ceilings(hbm_gbps=1000.0, l2_gbps=4000.0, sync_us=2.0,
                            sync_source="given", exchange_us=1.5,
                            exchange_source="given")
  nbytes = floor.WalkBytes(w2=8_000_000, base_logits=2_000_000, read_once=100_000,
                           outputs=1_000)
  one = floor.walk_floor(nbytes, 5, ceilings, resident_fraction=0.5)
  two = floor.walk_floor(nbytes, 5, ceilings, resident_fraction=0.5, devices=2)
  assert one["floor_exchange_us"] == 0.0 and two["floor_exchange_us"] == pytest.approx(7.5)
  # Half of W2 and of the base logits a device; the rest whole; the exchange added.
  assert two["floor_hbm_us"] == pytest.approx((4_000_000 + 1_000_000 + 101_000) / 1e6)
  assert two["floor_l2_us"] == pytest.approx(one["floor_l2_us"] / 2)
  assert two["floor_us"] == pytest.approx(two["floor_hbm_us"] + two["floor_l2_us"]
                                          + 5 * 2.0 + 7.5)


@NEEDS_8_DEVICES
def test_quick_run_of_the_sharded_stepwise_path_on_host_devices(tmp_path):
  """The whole harness on a 4-device CPU mesh: the path's chains take the placed first
  tokens and flush buffer, its tokens pass the gate, it is timed, and its floor is the
  4-device one."""
  devices = jax.devices()[:4]
  paths.register_path("sharded-cpu", lambda: None, functools.partial(
      sharded_paths.prepare_sharded_stepwise, devices=devices), replace=True)
  out = str(tmp_path / "sharded.json")
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      code = cli.main(["--platform", "cpu", "--quick", "--shape", "small_v1000",
                       "--flush-impl", "cond", "--paths", "xla,sharded-cpu",
                       "--out", out])
  finally:
    paths.unregister_path("sharded-cpu")
  assert code == 0
  with open(out) as handle:
    results = json.load(handle)
  records = [r for r in results["records"] if r["path"] == "sharded-cpu"]
  assert records
  for record in records:
    assert record["check"].startswith("ok"), record["check"]
    assert record["median_us"] is not None
    assert record["notes"]["devices"] == 4
    assert record["floor"]["devices"] == 4 and record["floor"]["floor_exchange_us"] == 0.0
  xla = [r for r in results["records"] if r["path"] == "xla"]
  assert records[0]["floor_us"] < xla[0]["floor_us"]
