"""Typed reads of a JSON config's fields: every refusal names the file, field and value.

``ConfigFields(config, where)`` wraps one config object (a ``config.json``, a section
of it, a converted directory's manifest); each reader checks the JSON type and the
range of one field and returns it, or raises ``ConversionError`` (a ``ValueError``) in
one line, e.g. ``config.json: rope_theta='abc' must be a number > 0``. JSON's types are
taken at their word: an int is not a bool, a bool is not the string ``"false"``, a
number is finite, ``null`` is an absent field. The Qwen3 target's config, the DeepSpec
drafter's and the manifest's drafter section are all read through it, so no field
reaches a model unchecked.
"""

from __future__ import annotations

import math
from typing import Any

from wts_jax.convert.errors import ConversionError

_REQUIRED = object()


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


class ConfigFields:
  """One JSON object's fields, read with their types checked.

  Every reader takes the field's ``name`` and a ``default`` (returned when the field is
  absent or ``null``; without one, the field is required).
  """

  def __init__(self, config: Any, where: str, prefix: str = ""):
    if not isinstance(config, dict):
      raise ConversionError(
          f"{where}: {prefix.rstrip('.') + '=' if prefix else ''}{config!r:.60} must be a "
          f"JSON object, not a {_json_type(config)}")
    self.config = config
    self.where = where
    self.prefix = prefix   # "rope_parameters." in a section: errors name the full path

  def __contains__(self, name: str) -> bool:
    return self.config.get(name) is not None

  def error(self, text: str) -> ConversionError:
    """A refusal of this config, ``where: text`` (text names the field)."""
    return ConversionError(f"{self.where}: {text}")

  def refuse(self, name: str, value: Any, wanted: str) -> ConversionError:
    """The error for field ``name`` holding ``value`` where ``wanted`` was expected."""
    return ConversionError(f"{self.where}: {self.prefix}{name}={value!r:.80} must be {wanted}")

  def _value(self, name: str, default: Any) -> tuple[Any, bool]:
    """(value, given): the default with given=False when the field is absent or null."""
    value = self.config.get(name)
    if value is not None:
      return value, True
    if default is _REQUIRED:
      raise ConversionError(f"{self.where}: lacks {self.prefix + name!r}"
                            if name not in self.config else
                            f"{self.where}: {self.prefix}{name}=null must be given")
    return default, False

  def integer(self, name: str, default: Any = _REQUIRED, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    value, given = self._value(name, default)
    if not given:
      return value
    if not _is_int(value) or (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum):
      raise self.refuse(name, value, _int_range(minimum, maximum))
    return value

  def positive_int(self, name: str, default: Any = _REQUIRED) -> int:
    return self.integer(name, default, minimum=1)

  def number(self, name: str, default: Any = _REQUIRED, *, above: float | None = None,
             minimum: float | None = None) -> float:
    """A finite JSON number (int or float) as a float; ``above`` is an exclusive bound."""
    value, given = self._value(name, default)
    if not given:
      return value
    if not _is_number(value) or not math.isfinite(value) or (
        above is not None and not value > above) or (minimum is not None
                                                     and value < minimum):
      bound = (f" > {above:g}" if above is not None else
               f" >= {minimum:g}" if minimum is not None else "")
      raise self.refuse(name, value, f"a finite number{bound}")
    return float(value)

  def flag(self, name: str, default: Any = _REQUIRED) -> bool:
    value, given = self._value(name, default)
    if given and not isinstance(value, bool):
      raise self.refuse(name, value, "true or false (a JSON boolean)")
    return value

  def choice(self, name: str, choices: tuple[str, ...], default: Any = _REQUIRED) -> str:
    value, given = self._value(name, default)
    if given and (not isinstance(value, str) or value not in choices):
      raise self.refuse(name, value, f"one of {choices}")
    return value

  def text(self, name: str, default: Any = _REQUIRED) -> str:
    value, given = self._value(name, default)
    if given and not isinstance(value, str):
      raise self.refuse(name, value, "a string")
    return value

  def int_list(self, name: str, default: Any = _REQUIRED, *,
               minimum: int | None = None) -> list[int]:
    """A non-empty JSON array of integers, each >= ``minimum``."""
    value, given = self._value(name, default)
    if given and (not isinstance(value, list) or not value or not all(
        _is_int(item) and (minimum is None or item >= minimum) for item in value)):
      raise self.refuse(name, value,
                        f"a non-empty list of integers{'' if minimum is None else f' >= {minimum}'}")
    return value

  def section(self, name: str) -> "ConfigFields | None":
    """A nested JSON object as its own ``ConfigFields`` (errors name ``where: name.x``);
    None when absent or null."""
    value, given = self._value(name, None)
    if not given:
      return None
    if not isinstance(value, dict):
      raise self.refuse(name, value, "a JSON object or null")
    return ConfigFields(value, self.where, f"{self.prefix}{name}.")


def _json_type(value) -> str:
  names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list"}
  return names.get(type(value), type(value).__name__)


def _int_range(minimum: int | None, maximum: int | None) -> str:
  if minimum is not None and maximum is not None:
    return f"an integer in [{minimum}, {maximum}]"
  if minimum == 1:
    return "a positive integer"
  if minimum is not None:
    return f"an integer >= {minimum}"
  if maximum is not None:
    return f"an integer <= {maximum}"
  return "an integer"
