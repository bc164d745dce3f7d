"""The shared walk suite on the step-wise XLA reference."""

from walk_suite import WalkSuite


class TestWalkXla(WalkSuite):
  IMPL = "xla"
