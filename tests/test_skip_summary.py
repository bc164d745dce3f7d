"""A skipped test's reason is printed even under ``-q`` (tests/conftest.py): on jax 0.10
the Mosaic GPU interpret tests skip, and a green CPU run must say so."""

from pathlib import Path

pytest_plugins = ["pytester"]


def test_skip_reasons_are_summarised_under_quiet(pytester):
  pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
  pytester.makepyfile(test_skipping="""
      import pytest

      @pytest.mark.skipif(True, reason="needs jax >= 0.11")
      @pytest.mark.parametrize("case", range(3))
      def test_interpreted(case):
        pass

      def test_runs():
        pass
  """)
  result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
  result.assert_outcomes(passed=1, skipped=3)
  result.stdout.fnmatch_lines(["*skipped tests, by reason*",
                               "3 skipped in *test_skipping.py: needs jax >= 0.11"])
