"""Peer implementations the benchmark measures against (and the tests check against)."""
