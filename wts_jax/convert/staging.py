"""Writing a converted directory atomically: stage next to DST, swap it in at the end.

Everything is written into a hidden sibling of ``DST``, ``.DST.wts-convert-PID@HOST``
(same filesystem, so the final rename is atomic); on any error or signal that would end
the process (``interrupts`` turns each into an exception, held during writes and the
clean-up) the staging directory is removed and ``DST`` is untouched. An existing
``DST`` is replaced only with ``force``, and only when it is an earlier wts-convert
output or an empty directory — ``--force`` never deletes a directory the converter did
not write.

The ``--force`` swap exchanges the staging directory and ``DST`` in one
``renameat2(RENAME_EXCHANGE)`` where the kernel offers it (Linux), so ``DST`` always
holds either the old or the new output; elsewhere the old ``DST`` is first renamed to
``.DST.wts-convert-old-PID@HOST`` and a run killed between the two renames leaves it
there. A process killed outright (``kill -9``) cannot clean up after itself: the next
conversion into the same folder removes the staging directories of processes of this
host that are no longer alive, and puts back an old output whose swap was cut short.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import socket
from pathlib import Path

from wts_jax.convert.errors import ConversionError
from wts_jax.convert.interrupts import deferred_interrupts
from wts_jax.convert.manifest import MANIFEST_FILE

STAGING_TAG = "wts-convert"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _host() -> str:
  # '@' and '/' would make the name ambiguous or a path; hosts never hold them anyway.
  return socket.gethostname().replace("/", "_").replace("@", "_") or "localhost"


def staging_name(dst: Path, pid: int, *, old: bool = False) -> str:
  return f".{dst.name}.{STAGING_TAG}-{'old-' if old else ''}{pid}@{_host()}"


# ".NAME.wts-convert-[old-]PID@HOST"; names without "@HOST" were written by wts_jax
# before hosts were recorded.
_LEFTOVER = re.compile(rf"\.(?P<name>.+)\.{STAGING_TAG}-(?P<old>old-)?(?P<pid>\d+)"
                       rf"(@(?P<host>.+))?")


def process_alive(pid: int) -> bool:
  """Whether process ``pid`` exists on this host (signal 0 checks without sending)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # another user's live process
    return True
  return True


def remove_dead_leftovers(dst: Path) -> list[str]:
  """Remove what killed conversions left in ``dst``'s folder; returns what was done.

  Only directories named by this module, of processes of this host that are no longer
  alive, are touched — whatever output they were for (another host's process cannot be
  checked, and a live conversion's staging is its own). A swap cut short between its
  two renames left the old output under the ``old-`` name and no output: it is renamed
  back.
  """
  parent = Path(dst).absolute().parent
  if not parent.is_dir():
    return []
  done = []
  try:
    entries = sorted(parent.iterdir())
  except OSError:
    return []   # an unreadable folder: the conversion's own errors say so
  for entry in entries:
    match = _LEFTOVER.fullmatch(entry.name)
    if match is None or (match["host"] not in (None, _host())):
      continue
    pid = int(match["pid"])
    if pid == os.getpid() or process_alive(pid) or not entry.is_dir() or entry.is_symlink():
      continue
    output = parent / match["name"]
    if match["old"] and not (output.exists() or output.is_symlink()):
      os.rename(entry, output)
      done.append(f"restored {output} from {entry.name} (a replaced output whose swap was "
                  "interrupted)")
    else:
      shutil.rmtree(entry, ignore_errors=True)
      done.append(f"removed {entry.name} (left by process {pid}, no longer running)")
  return done


def _replaceable(dst: Path) -> bool:
  return dst.is_dir() and not dst.is_symlink() and (
      (dst / MANIFEST_FILE).is_file() or not any(dst.iterdir()))


def check_destination(dst: Path, force: bool, sources: list[Path]) -> None:
  """Refuse a DST that exists (without ``force``) or that would overwrite the source."""
  resolved = dst.resolve()
  for source in sources:
    source = source.resolve()
    if resolved == source or resolved in source.parents:
      raise ConversionError(
          f"DST {dst} would overwrite the checkpoint being converted ({source})")
  if dst.exists() or dst.is_symlink():
    if not force:
      raise ConversionError(f"DST {dst} already exists; pass --force to replace it")
    if not _replaceable(dst):
      raise ConversionError(
          f"DST {dst} exists and is not a wts-convert output (no {MANIFEST_FILE}) nor an "
          "empty directory; refusing to replace it even with --force")


def _renameat2():
  try:
    function = ctypes.CDLL(None, use_errno=True).renameat2
  except (AttributeError, OSError):   # not glibc >= 2.28 / not Linux
    return None
  function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint]
  return function


def exchange_paths(first: Path, second: Path) -> bool:
  """Atomically swap two existing paths; False where the system cannot (then nothing
  has moved)."""
  renameat2 = _renameat2()
  if renameat2 is None:
    return False
  if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
               _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
    return False   # the filesystem does not support the exchange
  raise OSError(code, os.strerror(code), str(second))


class StagingDirectory:
  """``with StagingDirectory(dst, force) as staging:`` write under ``staging.path``,
  then ``staging.commit()``; leaving the block without a commit removes everything."""

  def __init__(self, dst: str | Path, *, force: bool):
    self.dst = Path(dst).absolute()
    self.force = force
    self.path = self.dst.parent / staging_name(self.dst, os.getpid())
    self._created_parents: list[Path] = []
    self._committed = False

  def __enter__(self) -> "StagingDirectory":
    missing = [parent for parent in self.dst.parents if not parent.exists()]
    for parent in reversed(missing):
      parent.mkdir()
      self._created_parents.append(parent)
    if self.path.exists():
      shutil.rmtree(self.path)   # left by a killed run of this same process id
    self.path.mkdir()
    return self

  def commit(self) -> None:
    """Put the staged output at ``dst``. Call it with interrupts deferred: the swap
    must not be cut short by this process's own signal handlers."""
    if not (self.dst.exists() or self.dst.is_symlink()):
      os.rename(self.path, self.dst)
      self._committed = True
      return
    check_destination(self.dst, self.force, [])   # it may have appeared meanwhile
    if exchange_paths(self.path, self.dst):
      self._committed = True    # self.path now holds the old output; __exit__ removes it
      return
    previous = self.dst.parent / staging_name(self.dst, os.getpid(), old=True)
    os.rename(self.dst, previous)
    try:
      os.rename(self.path, self.dst)
    except OSError:
      os.rename(previous, self.dst)
      raise
    self._committed = True
    shutil.rmtree(previous, ignore_errors=True)

  def __exit__(self, *exc) -> None:
    with deferred_interrupts():   # a second Ctrl-C must not cut the clean-up short
      shutil.rmtree(self.path, ignore_errors=True)
      if self._committed:
        return
      for parent in reversed(self._created_parents):
        try:
          parent.rmdir()
        except OSError:
          pass
