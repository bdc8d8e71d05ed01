"""The content hashes that say whether a release's contract files are the ones cpsim read.

A contract file is named by its path inside the wheel or sdist. A plain path is hashed whole (the
block-table modules: the host classes and the kernel). ``PATH#launch`` is the runner's launch lines:
the calls in PATH to the block-table classes and their slot-mapping methods (``LAUNCH_CALLS``), each
call's source with all whitespace removed, in file order. A runner changes in every release; what
cpsim models of it is only how it builds the tables and launches the slot mapping, so only those
calls are compared. ``PATH#def:NAME,...`` is the definitions of those names in PATH (functions,
methods, class fields: ``kv_cache_interface.py``'s widths and flags, beside a thousand lines of specs
cpsim does not read), each with its class, whitespace removed, in file order. Pure standard library:
the stack driver's child imports this too.
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

LAUNCH = "#launch"
DEFS = "def:"
ABSENT = "absent"  # the recorded "hash" of a contract file the release does not ship


def launch_source(text: str, calls: tuple[str, ...]) -> str:
    """The calls to ``calls`` (by the called name's last part) in ``text``, whitespace removed, one a line.
    A file that does not parse is taken whole (any change to it then counts)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node.func) in calls:
            segment = ast.get_source_segment(text, node) or ""
            found.append((node.lineno, node.col_offset, re.sub(r"\s+", "", segment)))
    return "\n".join(s for _, _, s in sorted(found))


def definitions_source(text: str, names: set[str]) -> str:
    """Each definition of ``names`` in ``text`` (a function or method, or a field assigned in a class body),
    as ``Class.name:source`` with whitespace removed, one a line in file order. A file that does not parse
    is taken whole."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    found = []

    def visit(body: list, owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{owner}{node.name}.")
            elif _defined_name(node) in names:
                segment = re.sub(r"\s+", "", ast.get_source_segment(text, node) or "")
                found.append((node.lineno, f"{owner}{_defined_name(node)}:{segment}"))

    visit(tree.body, "")
    return "\n".join(s for _, s in sorted(found))


def _defined_name(node: ast.stmt) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return ""


def _called_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def file_hash(root: Path, key: str, calls: tuple[str, ...]) -> str:
    """sha256 of contract file ``key`` under the release folder ``root`` (``ABSENT`` if it is not there)."""
    rel, _, part = key.partition("#")
    path = Path(root) / rel
    if not path.is_file():
        return ABSENT
    data = path.read_bytes()
    if part == LAUNCH[1:]:
        data = launch_source(data.decode("utf-8", "replace"), calls).encode()
    elif part.startswith(DEFS):
        data = definitions_source(data.decode("utf-8", "replace"), set(part[len(DEFS):].split(","))).encode()
    return hashlib.sha256(data).hexdigest()


def hashes(root: Path, keys, calls: tuple[str, ...]) -> dict[str, str]:
    return {k: file_hash(root, k, calls) for k in keys}
