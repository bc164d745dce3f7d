"""The package's shape, read from its source (no JAX, seconds): no file over 600 lines or
function over 200 in ``wts_jax/``, no version label ("v38", "NOTES v30") in its comments
or docstrings (a decision and its figure go to docs/decisions.md), no import circle among
its modules (imports inside functions count: they close a circle all the same), no
private name (``_x``) used across modules, and a README of at most 250 lines."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wts_jax"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 200
MAX_README_LINES = 250
# "v38", "NOTES v30", "v40 grid", "(v11)": a version of the project cited as a source.
VERSION_LABEL = re.compile(r"\bv\d{1,3}[a-z]?\b")


def _sources() -> dict[str, str]:
  return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
          for path in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _line_count(text: str) -> int:
  return len(text.splitlines())


def test_no_file_over_the_limit():
  long = {name: _line_count(text) for name, text in SOURCES.items()
          if _line_count(text) > MAX_FILE_LINES}
  assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_the_limit():
  long = []
  for name, text in SOURCES.items():
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _prose(text: str):
  """(line, text) of every comment and docstring of a module."""
  for token in tokenize.generate_tokens(io.StringIO(text).readline):
    if token.type == tokenize.COMMENT:
      yield token.start[0], token.string
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        yield body[0].lineno, body[0].value.value


def version_labels(text: str) -> list[tuple[int, str]]:
  return [(line, match.group()) for line, prose in _prose(text)
          for match in VERSION_LABEL.finditer(prose)]


def test_no_version_labels():
  found = [f"{name}:{line} {label!r}" for name, text in SOURCES.items()
           for line, label in version_labels(text)]
  assert not found, f"version labels in wts_jax/ (cite docs/decisions.md instead): {found}"


def test_the_label_check_sees_comments_and_docstrings_only():
  text = ('"""Chosen by the v38 grid."""\n'
          'X = 1  # faster (NOTES v30)\n'
          'PTX = "ld.shared.v4.b32 {$0}"\n'
          'def f():\n  """Fine."""\n  return "v2"\n')
  assert sorted(label for _, label in version_labels(text)) == ["v30", "v38"]


def _module_name(path: str) -> tuple[str, bool]:
  parts = path[:-len(".py")].split("/")
  is_package = parts[-1] == "__init__"
  return ".".join(parts[:-1] if is_package else parts), is_package


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
  """Module -> the package's modules it imports, anywhere in it (a ``from package import
  name`` counts as the submodule where ``name`` is one)."""
  modules = dict(_module_name(path) for path in sources)
  graph = {}
  for path, text in sources.items():
    name, is_package = _module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, ast.Import):
        deps.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = package.split(".")
          anchor = anchor[:len(anchor) - (node.level - 1)]
          base = ".".join(anchor + ([base] if base else []))
        submodules = [f"{base}.{alias.name}" for alias in node.names
                      if f"{base}.{alias.name}" in modules]
        deps.update(submodules)
        if len(submodules) < len(node.names):
          deps.add(base)
    graph[name] = {dep for dep in deps if dep in modules and dep != name}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for dep in sorted(graph[node]):
      if dep not in index:
        visit(dep)
        low[node] = min(low[node], low[dep])
      elif dep in on_stack:
        low[node] = min(low[node], index[dep])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def test_no_import_circles():
  assert circles(import_graph(SOURCES)) == []


def test_the_circle_check_finds_a_lazy_circle():
  sources = {"wts_jax/__init__.py": "", "wts_jax/a.py": "from wts_jax import b\n",
             "wts_jax/b.py": "def f():\n  from wts_jax.a import x\n",
             "wts_jax/c.py": "import wts_jax.a\n"}
  assert circles(import_graph(sources)) == [["wts_jax.a", "wts_jax.b"]]


def private_uses(sources: dict[str, str]) -> list[str]:
  """Where a module reaches another of the package's modules' private names (``_x``):
  imported by name, or read off a module it imported."""
  modules = dict(_module_name(path) for path in sources)
  found = []
  for path, text in sources.items():
    tree = ast.parse(text)
    bound = set()   # local names of the package's modules
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wts_jax"):
        for alias in node.names:
          if alias.name.startswith("_") and not alias.name.startswith("__"):
            found.append(f"{path}:{node.lineno} imports {node.module}.{alias.name}")
          if f"{node.module}.{alias.name}" in modules:
            bound.add(alias.asname or alias.name)
      elif isinstance(node, ast.Import):
        bound.update(alias.asname for alias in node.names
                     if alias.asname and alias.name in modules)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in bound and node.attr.startswith("_")
          and not node.attr.startswith("__")):
        found.append(f"{path}:{node.lineno} reads {node.value.id}.{node.attr}")
  return found


def test_no_private_name_crosses_a_module():
  assert private_uses(SOURCES) == []


def test_the_private_check_sees_imports_and_attributes():
  sources = {"wts_jax/__init__.py": "", "wts_jax/a.py": "def _x(): pass\n",
             "wts_jax/b.py": "from wts_jax.a import _x\n",
             "wts_jax/c.py": "from wts_jax import a\na._x()\nself._y = 1\n"}
  assert private_uses(sources) == ["wts_jax/b.py:1 imports wts_jax.a._x",
                                   "wts_jax/c.py:2 reads a._x"]


@pytest.mark.parametrize("name", ["README.md"])
def test_readme_is_short(name):
  lines = _line_count((ROOT / name).read_text(encoding="utf-8"))
  assert lines <= MAX_README_LINES, f"{name} has {lines} lines (at most {MAX_README_LINES})"
