import os

# The CPU suite must never grab a GPU by accident, and the GPU suite needs one.
if not os.environ.get("WTS_GPU_TESTS"):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_generate_tests(metafunc):
  """Suites subclassing ``walk_suite.WalkSuite`` choose their cases by class attributes."""
  cls = metafunc.cls
  for fixture, attribute in (("head_type", "HEAD_TYPES"), ("batch", "BATCHES"),
                             ("steps", "STEPS"), ("shape_name", "SHAPE_NAMES"),
                             ("residency", "RESIDENCIES")):
    if fixture in metafunc.fixturenames and cls is not None and hasattr(cls, attribute):
      metafunc.parametrize(fixture, getattr(cls, attribute))
