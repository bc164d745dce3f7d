"""Finding and reading a checkpoint: safetensors (one file or sharded), ``.bin``, or tensors.

``open_checkpoint(src)`` detects the format of a checkpoint directory or file, reads
``config.json`` and every tensor's header (name, shape, dtype) without reading the
data, and checks the files' integrity: a truncated or corrupt safetensors file, a
sparse file (whose header promises data its disk blocks do not hold), an index naming
a missing shard, a shard disagreeing with its index, or a config whose
``num_hidden_layers`` disagrees with the ``layers.N`` tensors present is refused here,
before anything is allocated for it. ``CheckpointSource.read`` then streams one tensor
at a time, in row chunks, straight into the output dtype, and refuses a tensor that is
not floating point, holds NaN/Inf, or is a weight matrix of zeros.

``.bin`` files are read only through ``torch.load(weights_only=True)`` (no arbitrary
pickles) and only they need torch; safetensors files are read with numpy (bf16 through
ml_dtypes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import re
import stat
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from wts_jax.convert.errors import ConversionError
from wts_jax.convert.progress import format_bytes
from wts_jax.convert.stored_names import normalize_key

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
# In the order transformers' from_pretrained looks for them when a directory holds several.
WEIGHT_FILES = (SAFETENSORS_FILE, SAFETENSORS_INDEX, BIN_FILE, BIN_INDEX)
TORCH_SUFFIXES = (".bin", ".pt", ".pth")
STATE_DICT_NAME = "<state dict>"

# Reading a large tensor in row chunks bounds the extra memory of a dtype cast and lets
# the progress bar move inside the 1.5 GB embedding of a 14B drafter.
CHUNK_BYTES = 64 << 20

SAFETENSORS_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}
NUMPY_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
                "float32": np.dtype(np.float32)}

TRAINING_FILES = (
    (re.compile(r"training_state\.rank\d+\.pt$"), "training state (optimizer, RNG), not weights"),
    (re.compile(r"train_config\.py$"), "training configuration, not weights"),
    (re.compile(r"step_latest$"), "link to the latest training step, not weights"),
)


@dataclasses.dataclass(frozen=True)
class StoredTensor:
  """A tensor's header: its DeepSpec key, its name as stored, its file, shape, dtype."""

  key: str
  stored_key: str
  file: str
  shape: tuple[int, ...]
  dtype: str     # numpy-style name: "bfloat16", "float32", "int64", …

  @property
  def nbytes(self) -> int:
    itemsize = NUMPY_DTYPES[self.dtype].itemsize if self.dtype in NUMPY_DTYPES else 0
    return math.prod(self.shape) * itemsize

  def where(self) -> str:
    """``'key' in file`` (with the stored name when it differs), for messages."""
    stored = "" if self.stored_key == self.key else f" (stored as {self.stored_key!r})"
    return f"{self.key!r}{stored} in {self.file}"


class TensorFile:
  """One file (or in-memory mapping) of tensors: headers up front, rows on demand."""

  name: str

  def headers(self) -> Iterator[tuple[str, tuple[int, ...], str]]:
    raise NotImplementedError

  def read_rows(self, stored_key: str, start: int, stop: int) -> np.ndarray:
    raise NotImplementedError

  def read_all(self, stored_key: str) -> np.ndarray:
    raise NotImplementedError

  def close(self) -> None:
    pass


class SafetensorsFile(TensorFile):

  def __init__(self, path: Path):
    from safetensors import SafetensorError, safe_open
    self.name = path.name
    try:
      self._file = safe_open(str(path), framework="numpy")
      self._file.__enter__()
      self._keys = list(self._file.keys())
    except SafetensorError as err:
      # safetensors checks that the header parses and that its byte ranges cover the
      # file exactly, so truncation and a damaged header both land here.
      raise ConversionError(
          f"{path}: corrupt or truncated safetensors file ({err})") from None
    except OSError as err:
      raise ConversionError(f"{path}: cannot read ({err})") from None

  def headers(self):
    for key in self._keys:
      tensor_slice = self._file.get_slice(key)
      dtype = tensor_slice.get_dtype()
      yield key, tuple(tensor_slice.get_shape()), SAFETENSORS_DTYPES.get(dtype, dtype.lower())

  def read_rows(self, stored_key, start, stop):
    return self._file.get_slice(stored_key)[start:stop]

  def read_all(self, stored_key):
    return self._file.get_tensor(stored_key)

  def close(self):
    self._file.__exit__(None, None, None)


def _torch():
  try:
    import torch
  except ImportError:
    raise ConversionError(
        "reading a PyTorch .bin checkpoint needs torch (pip install torch); safetensors "
        "checkpoints do not") from None
  return torch


def _torch_to_numpy(tensor) -> np.ndarray:
  torch = _torch()
  tensor = tensor.detach().cpu()
  if tensor.dtype == torch.bfloat16:
    # numpy has no bf16: reinterpret the same 16 bits as ml_dtypes' bfloat16.
    return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return tensor.contiguous().numpy()


class TensorMapping(TensorFile):
  """Tensors already in memory: torch tensors, numpy or JAX arrays."""

  def __init__(self, tensors: Mapping[str, Any], name: str):
    self.name = name
    self._tensors = dict(tensors)
    for key, value in self._tensors.items():
      if not isinstance(key, str):
        raise ConversionError(f"{name}: key {key!r} is not a string")
      if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise ConversionError(
            f"{name}: {key!r} holds a {type(value).__name__}, not a tensor (a nested "
            "checkpoint? pass the flat {name: tensor} state dict)")

  def headers(self):
    for key, value in self._tensors.items():
      yield key, tuple(int(size) for size in value.shape), _dtype_name(value.dtype)

  def _as_numpy(self, value) -> np.ndarray:
    if type(value).__module__.startswith("torch"):
      return _torch_to_numpy(value)
    return np.asarray(value)

  def read_rows(self, stored_key, start, stop):
    return self._as_numpy(self._tensors[stored_key][start:stop])

  def read_all(self, stored_key):
    return self._as_numpy(self._tensors[stored_key])


def _dtype_name(dtype) -> str:
  return str(dtype).removeprefix("torch.")


ZIP_MAGIC = b"PK\x03\x04"     # torch.save's default format is a zip archive
PICKLE_MAGIC = b"\x80"         # the legacy format starts with a pickle protocol opcode
# What torch's weights-only unpickler refused, as facts worth quoting. Nothing else of
# its message is passed on: around these facts it advises loading the file anyway
# (weights_only=False, allowlisting globals), in wordings that change between releases.
_REFUSED_FACTS = (
    (re.compile(r"GLOBAL ([\w.]+) was not an allowed global"),
     "it holds a pickled {} object, which only running its code builds"),
    (re.compile(r"Unsupported global: GLOBAL ([\w.]+)"),
     "it holds a pickled {} object, which only running its code builds"),
    (re.compile(r"unsupported GLOBAL ([\w.]+) whose module [\w.]+ is blocked"),
     "it calls {}, which no weights file needs"),
    (re.compile(r"Unsupported operand (\S+)"), "an unsupported pickle opcode {}"),
    (re.compile(r"TorchScript archive"), "a TorchScript archive: code, not a state dict"),
    (re.compile(r"legacy \.tar format"),
     "torch's legacy .tar format, which torch reads only by unpickling it unchecked"),
)


def _check_torch_container(path: Path) -> None:
  """Refuse a file that cannot be a complete ``torch.save`` output, before torch does
  (its messages for these are ``EOFError`` or ``[Errno 22] Invalid argument``)."""
  try:
    with path.open("rb") as file:
      head = file.read(len(ZIP_MAGIC))
  except OSError as err:
    raise ConversionError(f"{path}: cannot read ({err})") from None
  if not head:
    raise ConversionError(f"{path}: empty file (0 bytes); not a PyTorch checkpoint")
  if head == ZIP_MAGIC:
    if not zipfile.is_zipfile(path):
      raise ConversionError(
          f"{path}: truncated or corrupt .bin file (a zip archive without its central "
          f"directory; {path.stat().st_size} bytes)")
  elif not head.startswith(PICKLE_MAGIC):
    raise ConversionError(
        f"{path}: not a PyTorch checkpoint (neither torch.save's zip archive nor its "
        "legacy pickle format)")


def _unpickling_refusal(path: Path, err: Exception) -> ConversionError:
  """torch's refusal to unpickle ``path``, reduced to what it refused (never its advice
  to retry with weights_only=False: a checkpoint that needs arbitrary code to load is
  exactly what must not be loaded)."""
  text = str(err)
  reason = f"torch's weights-only unpickler refused it ({type(err).__name__})"
  for pattern, template in _REFUSED_FACTS:
    found = pattern.search(text)
    if found:
      reason = template.format(*found.groups())
      break
  return ConversionError(
      f"{path}: refused to unpickle ({reason}); wts-convert reads only plain "
      "{name: tensor} state dicts (torch.load(weights_only=True)) and never runs code "
      "from a checkpoint")


def _is_weights_only_refusal(err: Exception) -> bool:
  """torch refuses some files outside its unpickler (a TorchScript archive, the legacy
  .tar format) with a RuntimeError: they are refusals, not damage."""
  return isinstance(err, pickle.UnpicklingError) or "weights_only" in str(err)


def _torch_load(torch, path: Path):
  """``torch.load(weights_only=True)``, memory-mapped where the format allows; torch's
  warnings about a file it reads or refuses are not the user's to act on."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
      if "mmap" not in str(err):
        raise
    # Files written by the legacy (non-zip) torch.save cannot be memory-mapped.
    return torch.load(str(path), map_location="cpu", weights_only=True)


class TorchBinFile(TensorMapping):
  """A ``pytorch_model*.bin`` read with ``torch.load(weights_only=True)``, memory-mapped."""

  def __init__(self, path: Path):
    torch = _torch()
    _check_torch_container(path)
    try:
      state = _torch_load(torch, path)
    except FileNotFoundError as err:
      raise ConversionError(f"{path}: cannot read ({err})") from None
    except Exception as err:  # noqa: BLE001 - torch raises many types for a bad file
      if _is_weights_only_refusal(err):
        raise _unpickling_refusal(path, err) from None
      first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
      raise ConversionError(
          f"{path}: damaged PyTorch checkpoint, torch.load cannot read it "
          f"({type(err).__name__}: {first_line})") from None
    if not isinstance(state, dict):
      raise ConversionError(
          f"{path}: holds a {type(state).__name__}, not a {{name: tensor}} state dict")
    for key, value in state.items():
      if not isinstance(value, torch.Tensor):
        raise ConversionError(
            f"{path}: {key!r} holds a {type(value).__name__}, not a tensor (a training "
            "checkpoint? wts-convert reads the weights' flat state dict)")
    super().__init__(state, path.name)


# A file whose length exceeds twice what its disk blocks hold (plus this slack) is sparse:
# its holes read as zeros. Real weights compress by far less than 2x on filesystems that
# compress (their blocks count the compressed size), and holes are never written data.
SPARSE_SLACK_BYTES = 1 << 20


def _check_readable_and_stored(path: Path) -> None:
  """Refuse a file that cannot be opened, or whose bytes are mostly holes, before a
  library reads it (safetensors reports an unreadable file as "No such file", and a
  sparse file's holes would load as an all-zero model as large as its header says)."""
  try:
    with path.open("rb") as file:
      file.read(1)
      stat = os.fstat(file.fileno())
  except OSError as err:
    raise ConversionError(f"{path}: cannot read ({err.strerror or err})") from None
  stored = stat.st_blocks * 512
  # st_blocks is 0 where a filesystem does not report it: no evidence either way.
  if stat.st_blocks and stat.st_size > 2 * stored + SPARSE_SLACK_BYTES:
    raise ConversionError(
        f"{path}: {format_bytes(stat.st_size)} long but only {format_bytes(stored)} of it "
        "is stored on disk: a sparse file, whose holes would load as zeros (an "
        "interrupted or fake download?); refused before reading it")


def _open_file(path: Path) -> TensorFile:
  _check_readable_and_stored(path)
  if path.suffix == ".safetensors":
    return SafetensorsFile(path)
  if path.suffix in TORCH_SUFFIXES:
    return TorchBinFile(path)
  raise ConversionError(
      f"{path}: unrecognised checkpoint file (expected .safetensors, "
      f"{', '.join(TORCH_SUFFIXES)} or an .index.json)")


_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def _index_ranges(indices: list[int], shown: int = 4) -> str:
  """``[0, 1, 2, 4, 5]`` → ``"0-2, 4-5"`` (the first ``shown`` runs)."""
  runs: list[list[int]] = []
  for index in indices:
    if runs and index == runs[-1][1] + 1:
      runs[-1][1] = index
    else:
      runs.append([index, index])
  text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:shown])
  return text + (", …" if len(runs) > shown else "")


class CheckpointSource:
  """A checkpoint's config, its tensors' headers (by DeepSpec key), and their data.

  format: a short description (``"safetensors"``, ``"safetensors, sharded (3 files)"``,
  ``"pytorch .bin"``, …); ignored: ``(file name, reason)`` for every file of the
  checkpoint directory that is not read. Use as a context manager (files stay open).
  """

  def __init__(self, *, location: str, format: str, config: dict, config_file: str,
               files: list[TensorFile], ignored: list[tuple[str, str]]):
    self.location = location
    self.format = format
    self.config = config
    self.config_file = config_file
    self.ignored = ignored
    self._files = {file.name: file for file in files}
    self.tensors: dict[str, StoredTensor] = {}
    for file in files:
      for stored_key, shape, dtype in file.headers():
        tensor = StoredTensor(normalize_key(stored_key), stored_key, file.name, shape,
                              dtype)
        earlier = self.tensors.get(tensor.key)
        if earlier is not None:
          raise ConversionError(
              f"{location}: {earlier.where()} and {tensor.where()} are the same key "
              "once wrapper prefixes (_orig_mod., module., model.) are stripped")
        self.tensors[tensor.key] = tensor
    self._check_layer_count()

  def _check_layer_count(self) -> None:
    """The config's ``num_hidden_layers`` against the ``layers.N`` tensors present, before
    anyone builds a key table from it: a config claiming millions of layers must not
    cost millions of table entries to refuse."""
    layers = self.config.get("num_hidden_layers") if isinstance(self.config, dict) else None
    if isinstance(layers, bool) or not isinstance(layers, int):
      return   # the config's reader names a missing or mistyped field
    present = sorted({int(match[1]) for match in map(_LAYER_INDEX.match, self.tensors)
                      if match})
    if not present:
      return   # the head alone (a state dict of the serial head): no layers to count
    if len(present) != layers or present[0] != 0 or present[-1] != layers - 1:
      raise ConversionError(
          f"{self.config_file}: num_hidden_layers={layers}, but {self.location} holds "
          f"layers {_index_ranges(present)} ({len(present)} layers)")

  def __enter__(self) -> "CheckpointSource":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    for file in self._files.values():
      file.close()
    self._files = {}

  def read(self, key: str, out_dtype: str,
           on_bytes: Callable[[int], None] | None = None) -> np.ndarray:
    """The tensor ``key`` as a numpy array of ``out_dtype``, read in row chunks.

    Refuses a tensor holding NaN or Inf (a damaged file, or a diverged run): the walk
    would silently draft garbage from it.
    """
    tensor = self.tensors[key]
    file = self._files[tensor.file]
    if tensor.dtype not in NUMPY_DTYPES:
      raise ConversionError(
          f"{tensor.where()} has dtype {tensor.dtype}, not one of {sorted(NUMPY_DTYPES)}: "
          "not a floating-point weight of a bf16/fp16/fp32 checkpoint")
    source_dtype = NUMPY_DTYPES[tensor.dtype]
    out = np.empty(tensor.shape, NUMPY_DTYPES[out_dtype])
    rows = tensor.shape[0] if tensor.shape else 1
    row_bytes = source_dtype.itemsize * math.prod(tensor.shape[1:])
    rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    non_finite = 0
    all_zero = True
    for start in range(0, rows, rows_per_chunk):
      stop = min(rows, start + rows_per_chunk)
      if tensor.shape:
        chunk = file.read_rows(tensor.stored_key, start, stop)
        out[start:stop] = chunk
      else:
        chunk = file.read_all(tensor.stored_key)
        out[...] = chunk
      non_finite += int(chunk.size - np.count_nonzero(np.isfinite(chunk)))
      all_zero = all_zero and not chunk.any()
      if on_bytes is not None:
        on_bytes(chunk.size * source_dtype.itemsize)
    if non_finite:
      raise ConversionError(
          f"{tensor.where()} holds {non_finite} non-finite values (NaN/Inf): the file "
          "is damaged or the training diverged")
    if all_zero and len(tensor.shape) >= 2 and out.size:
      raise ConversionError(
          f"{tensor.where()} is all zeros: no trained weight matrix is; the file was "
          "zero-filled (preallocated and never written, or sparse)")
    return out


def _read_json(path: Path, what: str) -> Any:
  try:
    return json.loads(path.read_text())
  except OSError as err:
    raise ConversionError(f"{path}: cannot read {what} ({err})") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConversionError(f"{path}: {what} is not valid JSON ({err})") from None


def _ignore_reason(name: str, path: Path) -> str:
  for pattern, reason in TRAINING_FILES:
    if pattern.match(name):
      return reason
  if path.is_dir() and not path.is_symlink():
    return "directory, not read"
  return "not part of the weights"


def _index_shards(index_path: Path) -> list[tuple[Path, set[str]]]:
  """The shards an index names, each with the stored keys the index maps to it."""
  index = _read_json(index_path, "the shard index")
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict) or not weight_map:
    raise ConversionError(f"{index_path}: has no 'weight_map' of tensor names to shards")
  directory = index_path.parent
  shards: dict[str, set[str]] = {}
  for key, shard in weight_map.items():
    if not isinstance(shard, str) or Path(shard).name != shard:
      raise ConversionError(
          f"{index_path}: maps {key!r} to shard {shard!r}, which is not a file name in "
          f"{directory}")
    shards.setdefault(shard, set()).add(key)
  for shard in shards:
    if not (directory / shard).is_file():
      raise ConversionError(
          f"{index_path}: names shard {shard!r}, which does not exist in {directory}")
  return [(directory / shard, keys) for shard, keys in sorted(shards.items())]


def _check_shard_agrees(index_path: Path, file: TensorFile, indexed_keys: set[str]):
  held = {key for key, _, _ in file.headers()}
  not_held = sorted(indexed_keys - held)
  if not_held:
    raise ConversionError(
        f"{index_path}: maps {not_held[0]!r} to shard {file.name}, which does not hold it")
  not_indexed = sorted(held - indexed_keys)
  if not_indexed:
    raise ConversionError(
        f"{file.name} holds {not_indexed[0]!r}, which {index_path.name} does not map to it")


def _listing(directory: Path) -> list[Path]:
  try:
    return sorted(directory.iterdir())
  except OSError as err:
    raise ConversionError(
        f"{directory}: cannot list the directory ({err.strerror or err})") from None


def _kind(path: Path, what: str) -> int | None:
  """``path``'s file type (``stat.S_IFMT``), None when it does not exist; refuses a path
  that cannot be looked at (a parent without search permission)."""
  try:
    return stat.S_IFMT(path.stat().st_mode)
  except (FileNotFoundError, NotADirectoryError):
    return None
  except OSError as err:
    raise ConversionError(f"{path}: cannot read {what} ({err.strerror or err})") from None


def _weights_in(directory: Path) -> Path:
  listing = _listing(directory)
  for name in WEIGHT_FILES:
    if _kind(directory / name, "the weights") == stat.S_IFREG:
      return directory / name
  found = [path.name for path in listing]
  raise ConversionError(
      f"{directory}: no {', '.join(WEIGHT_FILES)} found (the directory holds "
      f"{found if found else 'nothing'}); pass a weights file to convert another name")


def open_checkpoint(src: str | Path) -> CheckpointSource:
  """Detect and open the checkpoint at ``src`` (a directory, a weights file or an index).

  ``config.json`` must sit in the checkpoint directory (the file's directory when
  ``src`` is a file).
  """
  path = Path(src)
  kind = _kind(path, "the checkpoint")
  if kind is None:
    raise ConversionError(f"{path}: no such checkpoint file or directory")
  weights = _weights_in(path) if kind == stat.S_IFDIR else path
  directory = weights.parent
  config_path = directory / CONFIG_FILE
  if _kind(config_path, "the config") != stat.S_IFREG:
    raise ConversionError(
        f"{config_path}: missing; the drafter's config.json must sit next to its weights")
  config = _read_json(config_path, "the config")

  files: list[TensorFile] = []
  used = {CONFIG_FILE, weights.name}
  try:
    if weights.name.endswith(".index.json"):
      shards = _index_shards(weights)
      for shard_path, keys in shards:
        file = _open_file(shard_path)
        files.append(file)
        _check_shard_agrees(weights, file, keys)
        used.add(shard_path.name)
      kind = "pytorch .bin" if shards[0][0].suffix in TORCH_SUFFIXES else "safetensors"
      description = f"{kind}, sharded ({len(shards)} files, index {weights.name})"
    else:
      files.append(_open_file(weights))
      description = "safetensors" if weights.suffix == ".safetensors" else "pytorch .bin"

    ignored = []
    for entry in _listing(directory):
      if entry.name in used:
        continue
      reason = _ignore_reason(entry.name, entry)
      if entry.name in WEIGHT_FILES or entry.suffix in (".safetensors",) + TORCH_SUFFIXES:
        if reason == "not part of the weights":
          reason = f"weights not selected ({weights.name} is read)"
      ignored.append((entry.name, reason))
    return CheckpointSource(location=str(path), format=description, config=config,
                            config_file=str(config_path), files=files, ignored=ignored)
  except BaseException:
    for file in files:
      file.close()
    raise


def state_dict_source(state_dict: Mapping[str, Any], config: dict) -> CheckpointSource:
  """A ``CheckpointSource`` over tensors already in memory (torch, numpy or JAX)."""
  if not isinstance(state_dict, Mapping):
    raise ConversionError(
        f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
  return CheckpointSource(location=STATE_DICT_NAME, format="in-memory state dict",
                          config=config, config_file="config dict",
                          files=[TensorMapping(state_dict, STATE_DICT_NAME)], ignored=[])
