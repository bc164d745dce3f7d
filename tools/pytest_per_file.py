"""Run a pytest selection one test file per process: how CI runs the suites.

  python tools/pytest_per_file.py -q                              # CI's first run
  python tools/pytest_per_file.py -q -m "mosaic and not gpu"      # CI's second run

Why: run in one long process, the suites have ended in a crash inside an XLA CPU
compile late in the run (an abort in the Mosaic interpret suites after hundreds of
kernels, a segfault at 91 % of the CPU suite), never with the file run alone; a process
per file gives each file a fresh client. The arguments are pytest's; the selection is
collected once, then each file that holds selected tests runs in its own
``python -m pytest ARGS FILE``. Exit status: 0 when every file passed, else the first
failing file's status (a file whose process was killed by a signal counts as 1), with
one summary line a file.
"""

from __future__ import annotations

import subprocess
import sys
import time

NO_TESTS_COLLECTED = 5


def selected_files(args: list[str]) -> list[str]:
  """The test files that hold at least one test of the selection, in collection order."""
  listing = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                            "-p", "no:cacheprovider", *args],
                           capture_output=True, text=True, check=False)
  if listing.returncode not in (0, NO_TESTS_COLLECTED):
    sys.stderr.write(listing.stdout[-4000:] + listing.stderr[-4000:])
    raise SystemExit(f"error: collecting the tests failed (pytest exit "
                     f"{listing.returncode})")
  files: list[str] = []
  for line in listing.stdout.splitlines():
    # "path::test[id]" lines, or "path: count" ones when the arguments hold -q too
    path, _, count = line.rpartition(": ")
    if "::" in line:
      path = line.split("::", 1)[0]
    elif not (path.endswith(".py") and count.isdigit()):
      continue
    if path not in files:
      files.append(path)
  return files


def main(argv: list[str] | None = None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  files = selected_files(args)
  if not files:
    print("no test selected")
    return NO_TESTS_COLLECTED
  results = []
  for path in files:
    began = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "pytest", *args, path],
                          check=False).returncode
    code = 1 if code < 0 else code     # killed by a signal
    results.append((path, code, time.perf_counter() - began))
  print("== one process a file")
  for path, code, seconds in results:
    print(f"{'passed' if code == 0 else f'FAILED ({code})':>12}  {seconds:7.1f} s  {path}")
  failed = [code for _, code, _ in results if code not in (0, NO_TESTS_COLLECTED)]
  return failed[0] if failed else 0


if __name__ == "__main__":
  sys.exit(main())
