import collections
import os

# The CPU suite must never grab a GPU by accident, and the GPU suite needs one.
if not os.environ.get("WTS_GPU_TESTS"):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # Mosaic GPU interpret mode runs each warpgroup as a thread whose barrier waits block
  # inside host callbacks; with the CPU client's default threads (one a core) a kernel
  # of more warpgroups than cores can starve and hang (seen on 2 cores, three
  # warpgroups). More host devices give the client more threads.
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()


def pytest_generate_tests(metafunc):
  """Suites subclassing ``walk_suite.WalkSuite`` choose their cases by class attributes."""
  cls = metafunc.cls
  for fixture, attribute in (("head_type", "HEAD_TYPES"), ("batch", "BATCHES"),
                             ("steps", "STEPS"), ("shape_name", "SHAPE_NAMES"),
                             ("residency", "RESIDENCIES")):
    if fixture in metafunc.fixturenames and cls is not None and hasattr(cls, attribute):
      metafunc.parametrize(fixture, getattr(cls, attribute))


def pytest_terminal_summary(terminalreporter):
  """Why tests were skipped, one line per reason, even under ``-q``: on jax 0.10 the
  Mosaic GPU interpret tests skip, and a green CPU run must not read as covering them."""
  reasons = collections.Counter()
  for report in terminalreporter.stats.get("skipped", []):
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reasons[(report.fspath, reason.removeprefix("Skipped: "))] += 1
  if reasons:
    terminalreporter.write_sep("-", "skipped tests, by reason")
    for (path, reason), count in sorted(reasons.items()):
      terminalreporter.write_line(f"{count} skipped in {path}: {reason}")
