"""A stored tensor's name as the key table spells it: the prefixes that wrappers put in
front of a module's names taken off."""

from __future__ import annotations

# Wrappers that torch.compile, DDP/FSDP and HF-style models put in front of the names.
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "model.")


def normalize_key(key: str) -> str:
  """``key`` without the wrapper prefixes (``_orig_mod.``, ``module.``, ``model.``)."""
  stripped = True
  while stripped:
    stripped = False
    for prefix in WRAPPER_PREFIXES:
      if key.startswith(prefix):
        key = key[len(prefix):]
        stripped = True
  return key
