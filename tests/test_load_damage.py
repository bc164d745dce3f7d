"""``wts_jax.load`` on a converted directory damaged after conversion.

Each case damages one thing — an array file truncated, zeroed or with one bit flipped,
the manifest edited — and checks what the converter's refusal tests check: one error
type (``CheckpointError``), one line naming the file and what is wrong, and no asyncio
noise on stderr.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flax import nnx

pytest.importorskip("torch")

import wts_jax  # noqa: E402
from convert_fixtures import (HIDDEN, RANK, VOCAB, drafter_config,  # noqa: E402
                              drafter_state_dict, write_checkpoint)
from wts_jax.convert.cli import main  # noqa: E402
from wts_jax.convert.manifest import flatten  # noqa: E402
from wts_jax.convert.orbax_errors import quiet_abandoned_coroutines  # noqa: E402
from wts_jax.convert.writer import save_arrays  # noqa: E402

MANIFEST = "wts_config.json"
NOISE = ("Exception ignored", "Event loop is closed", "Traceback", "Task was destroyed")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp("converted")
  config = drafter_config("gated", confidence=True)
  src = write_checkpoint(root / "src", config, drafter_state_dict(config))
  assert main([str(src), str(root / "dst"), "--full", "--no-progress"]) == 0
  return root / "dst"


def largest_array_file(item: Path) -> Path:
  return max((path for path in item.rglob("*") if path.is_file() and path.parent.name == "d"),
             key=lambda path: path.stat().st_size)


def edit_file(path: Path, edit) -> None:
  data = bytearray(path.read_bytes())
  path.write_bytes(bytes(edit(data)))


def edit_manifest(directory: Path, edit) -> None:
  manifest = json.loads((directory / MANIFEST).read_text())
  edit(manifest)
  (directory / MANIFEST).write_text(json.dumps(manifest))


def _truncated(dst):
  edit_file(largest_array_file(dst / "head"), lambda data: data[:len(data) // 2])


def _zeroed(dst):
  edit_file(largest_array_file(dst / "head"), lambda data: bytes(len(data)))


def _emptied(dst):
  edit_file(largest_array_file(dst / "head"), lambda data: b"")


def read_unchecked(item: Path) -> dict[str, np.ndarray] | None:
  """An item's arrays as orbax reads them, with none of the loader's checks; None when
  orbax cannot read them."""
  import orbax.checkpoint as ocp
  checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
  try:
    with quiet_abandoned_coroutines():
      return flatten(checkpointer.restore(item.absolute()))
  except Exception:  # noqa: BLE001 - TensorStore raises a bare Exception
    return None
  finally:
    checkpointer.close()


def _bit_flipped(dst):
  """One bit flipped where it changes a stored value. The array files are compressed and
  orbax packs them in an order that varies between runs, so a bit at a fixed offset can
  land where the decoder never looks (padding of an entropy-coded stream): the flip moves
  from the file's middle until orbax itself reads different values without an error."""
  path = largest_array_file(dst / "head")
  original = path.read_bytes()
  before = read_unchecked(dst / "head")
  for offset in range(len(original) // 2, len(original)):
    data = bytearray(original)
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    after = read_unchecked(dst / "head")
    if after is not None and any(before[key].tobytes() != after[key].tobytes()
                                 for key in before):
      return
  raise AssertionError(f"no single-bit flip in the second half of {path} changes a value")


def _item_deleted(dst):
  shutil.rmtree(dst / "head")


def _orbax_metadata_deleted(dst):
  (dst / "head" / "_METADATA").unlink()


def _manifest_without_head(dst):
  edit_manifest(dst, lambda manifest: manifest.pop("head"))


def _manifest_not_json(dst):
  (dst / MANIFEST).write_text('{"format": "wts_jax.drafter", ')


def _manifest_missing(dst):
  (dst / MANIFEST).unlink()


def _rank_edited(dst):
  edit_manifest(dst, lambda manifest: manifest["head"].update(rank=RANK // 2))


def _rank_edited_everywhere(dst):
  """The head config and every listed shape agree on the new rank; the files do not."""
  def edit(manifest):
    manifest["head"]["rank"] = RANK // 2
    manifest["tensors"]["head"] = {
        key: [RANK // 2 if size == RANK else
              size - RANK // 2 if size == HIDDEN + RANK else size for size in shape]
        for key, shape in manifest["tensors"]["head"].items()}
  edit_manifest(dst, edit)


def _head_type_edited(dst):
  edit_manifest(dst, lambda manifest: manifest["head"].update(head_type="lstm"))


def _head_flag_edited(dst):
  edit_manifest(dst, lambda manifest: manifest["head"].update(confidence="false"))


def _dtype_edited(dst):
  edit_manifest(dst, lambda manifest: manifest.update(dtype="int8"))


def rewrite_head(dst: Path, edit) -> None:
  """Write ``head/`` again, through the converter's own writer, with ``edit`` applied to
  its arrays (by DeepSpec key)."""
  head = wts_jax.load(dst)
  arrays = {key: np.array(value) for key, value in
            flatten(nnx.to_pure_dict(nnx.state(head, nnx.Param))).items()}
  edit(arrays)
  shutil.rmtree(dst / "head")
  save_arrays(dst / "head", arrays)


def _nan_without_checksums(dst):
  """A directory written before checksums were recorded, with a NaN in W2."""
  rewrite_head(dst, lambda arrays: arrays["markov_head.markov_w2.weight"].__setitem__(
      (7, 3), np.nan))
  edit_manifest(dst, lambda manifest: manifest.pop("checksums"))


def _array_missing_from_item(dst):
  rewrite_head(dst, lambda arrays: arrays.pop("markov_head.markov_w2.weight"))


def _array_not_in_manifest(dst):
  rewrite_head(dst, lambda arrays: arrays.update(
      {"markov_head.extra.weight": np.zeros((3, 3), np.float32)}))


DAMAGES = [
    (_truncated, ["/head: cannot read the orbax checkpoint", "OCDBT database",
                  "is not valid for value of size"]),
    (_zeroed, ["/head: cannot read the orbax checkpoint", "OCDBT database"]),
    (_emptied, ["/head: cannot read the orbax checkpoint", "value of size 0"]),
    (_bit_flipped, ["/head: 'markov_head.", "does not match its checksum", "damaged"]),
    (_item_deleted, ["/head: missing; the converted directory is incomplete"]),
    (_orbax_metadata_deleted, ["/head: cannot read the orbax checkpoint"]),
    (_manifest_without_head, [f"{MANIFEST}: lacks 'head'; the manifest was edited"]),
    (_manifest_not_json, [f"{MANIFEST}: unreadable"]),
    (_manifest_missing, [f"no {MANIFEST}; not a wts-convert output"]),
    (_rank_edited, [f"{MANIFEST}: the head config (gated, vocab_size={VOCAB}, rank={RANK // 2}",
                    f"requires 'markov_head.markov_w1.weight' of shape [{VOCAB}, {RANK // 2}]",
                    f"head/ holds [{VOCAB}, {RANK}]"]),
    (_rank_edited_everywhere, [f"/head: 'markov_head.markov_w1.weight' is stored as "
                               f"[{VOCAB}, {RANK}] bfloat16, {MANIFEST} says "
                               f"[{VOCAB}, {RANK // 2}]"]),
    (_head_type_edited, [f"{MANIFEST}: head", "head_type='lstm' must be one of"]),
    (_dtype_edited, [f"{MANIFEST}: dtype='int8' is not one of"]),
    (_head_flag_edited, [f"{MANIFEST}: head", "confidence='false' must be a bool"]),
    (_nan_without_checksums, ["'markov_head.markov_w2.weight' holds 1 non-finite values"]),
    (_array_missing_from_item, [f"/head: lacks 'markov_head.markov_w2.weight', which "
                                f"{MANIFEST} lists"]),
    (_array_not_in_manifest, [f"/head: holds 'markov_head.extra.weight', which {MANIFEST} "
                              "does not list"]),
]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage,messages", DAMAGES,
                         ids=[case[0].__name__.strip("_") for case in DAMAGES])
def test_damage_is_one_checkpoint_error_naming_the_file(tmp_path, capfd, converted, damage,
                                                        messages):
  dst = tmp_path / "dst"
  shutil.copytree(converted, dst)
  damage(dst)
  capfd.readouterr()
  for load in (wts_jax.load, wts_jax.load_drafter):
    with pytest.raises(wts_jax.CheckpointError) as raised:
      load(dst)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 500, message
    for expected in messages:
      assert expected in message, (expected, message)
  err = capfd.readouterr().err
  assert not any(noise in err for noise in NOISE), err


@pytest.mark.parametrize("field,value,message", [
    ("block_size", "7", "drafter.block_size='7' must be a positive integer"),
    ("target_layer_ids", [1, "3"], "drafter.target_layer_ids=[1, '3'] must be a non-empty "
                                   "list of integers >= -1"),
    ("confidence", 1, "drafter.confidence=1 must be true or false"),
    ("mask_token_id", VOCAB, f"drafter.mask_token_id={VOCAB} must be an integer in [0, "
                             f"{VOCAB - 1}]"),
    ("markov_head_type", "lstm", "drafter.markov_head_type='lstm' must be one of"),
    ("layers", 2, "drafter holds 'layers', which is not a drafter config field"),
])
def test_edited_drafter_config_is_named(tmp_path, converted, field, value, message):
  dst = tmp_path / "dst"
  shutil.copytree(converted, dst)
  edit_manifest(dst, lambda manifest: manifest["drafter"].update({field: value}))
  with pytest.raises(wts_jax.CheckpointError) as raised:
    wts_jax.load_drafter(dst)
  text = str(raised.value)
  assert "\n" not in text and f"{MANIFEST}: {message}" in text, text
  assert "the manifest was edited or damaged" in text, text


def test_undamaged_directory_still_loads(converted):
  head = wts_jax.load(converted)
  drafter = wts_jax.load_drafter(converted, dtype=np.float32)
  assert head.config.rank == RANK and drafter.head.config == head.config
  assert drafter.backbone["lm_head.weight"].dtype == np.float32


def test_abandoned_coroutines_are_not_reported(monkeypatch):
  """What orbax leaves when one read fails: a suspended read whose clean-up needs the
  loop it ran on, collected after that loop was closed."""
  async def read_in_flight(loop_ready: asyncio.Future):
    loop = asyncio.get_running_loop()
    loop_ready.set_result(None)
    try:
      await asyncio.sleep(60)
    finally:
      loop.call_soon(lambda: None)   # RuntimeError: Event loop is closed

  def abandon_one():
    loop = asyncio.new_event_loop()
    ready = loop.create_future()
    task = loop.create_task(read_in_flight(ready))
    loop.run_until_complete(ready)
    loop.close()
    del task
    gc.collect()

  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  abandon_one()
  assert len(reported) == 1 and "Event loop is closed" in str(reported[0].exc_value)
  with quiet_abandoned_coroutines():
    abandon_one()
    sys.unraisablehook(SimpleNamespace(object=None, exc_value=ValueError("other")))
  assert len(reported) == 2 and "other" in str(reported[1].exc_value)


def test_late_loop_closed_reports_after_a_failed_block_are_dropped(monkeypatch):
  """TensorStore's threads hand reads that were in flight to orbax's loop after it closed
  and after the block ended: those reports are dropped, others still reach the hook, a
  second failed block does not stack a second filter, and a clean block keeps it."""
  reported = []
  monkeypatch.setattr(sys, "unraisablehook", reported.append)
  for _ in range(2):
    with pytest.raises(ValueError), quiet_abandoned_coroutines():
      raise ValueError("a read failed")
  late = SimpleNamespace(object=None, exc_value=RuntimeError("Event loop is closed"))
  sys.unraisablehook(late)
  sys.unraisablehook(SimpleNamespace(object=None, exc_value=ValueError("other")))
  assert [str(report.exc_value) for report in reported] == ["other"]
  assert sys.unraisablehook.previous == reported.append
  lingering = sys.unraisablehook
  with quiet_abandoned_coroutines():
    pass
  assert sys.unraisablehook is lingering   # stragglers of the failed read may still come
