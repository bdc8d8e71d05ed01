"""The layers of docs/ARCHITECTURE.md hold: import-linter's contracts (pyproject.toml) pass, an
upward import breaks them, and no import cycle joins two modules of cpsim.

Both tools read every import statement, function-level ones included. Each check runs in a
child process against a directory on PYTHONPATH, so a broken copy of the package can be
judged the same way as the real one. import-linter (and grimp, which it brings) is in the
``test`` extra: without it these tests fail rather than skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CYCLES = r"""
import json, sys
import grimp

level = int(sys.argv[1])
g = grimp.build_graph("cpsim", cache_dir=None)
key = lambda m: ".".join(m.split(".")[:level])
adj = {}
for m in g.modules:
    adj.setdefault(key(m), set())
    for d in g.find_modules_directly_imported_by(m):
        if key(d) != key(m):
            adj[key(m)].add(key(d))
index, low, stack, on, found = {}, {}, [], set(), []
def visit(v):  # Tarjan: the strongly connected components of more than one module are the cycles
    index[v] = low[v] = len(index)
    stack.append(v); on.add(v)
    for w in sorted(adj.get(v, ())):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            found.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in sorted(adj):
    if v not in index:
        visit(v)
print(json.dumps(found))
"""


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of ``root/pyproject.toml`` over ``root/cpsim``."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache", "--no-logo"], cwd=root, env=_env(root),
                          capture_output=True, text=True, timeout=300)


def cycles(root: Path, level: int) -> list[set[str]]:
    """The import cycles of ``root/cpsim`` between modules named to ``level`` dotted parts
    (2: ``cpsim.run``, ``cpsim.check``, ...; 99: every module)."""
    out = subprocess.run([sys.executable, "-c", _CYCLES, str(level)], cwd=root, env=_env(root),
                         capture_output=True, text=True, timeout=300, check=True)
    return [set(c) for c in json.loads(out.stdout)]


def broken_copy(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contracts with ``line`` appended to ``module`` (a path
    under cpsim/, created when missing)."""
    shutil.copytree(ROOT / "cpsim", tmp_path / "cpsim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "cpsim" / module
    with target.open("a") as f:
        f.write(f"\n{line}\n")
    return tmp_path


def test_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_upward_import_breaks_the_layers(tmp_path):
    r = lint_imports(broken_copy(tmp_path, "layout.py", "import cpsim.cli  # upward: math reaching for the CLI"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cpsim layers (top to bottom) BROKEN" in r.stdout
    assert "cpsim.layout -> cpsim.cli" in r.stdout


def test_function_level_upward_import_breaks_the_layers(tmp_path):
    line = "def _late():\n    from cpsim.run import world  # a lazy import counts too\n    return world"
    r = lint_imports(broken_copy(tmp_path, "kernels/select.py", line))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cpsim.kernels.select -> cpsim.run.world" in r.stdout


def test_the_oracle_importing_a_runner_breaks_its_contract(tmp_path):
    r = lint_imports(broken_copy(tmp_path, "check/coordinator.py", "import cpsim.faults"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the oracle (cpsim.check) imports nothing that runs kernels BROKEN" in r.stdout
    assert "cpsim.check.coordinator -> cpsim.faults" in r.stdout


def test_a_module_outside_every_layer_breaks_the_layers(tmp_path):
    r = lint_imports(broken_copy(tmp_path, "newpart.py", '"""a new top-level module no layer names"""'))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cpsim.newpart" in r.stdout


def test_sibling_layers_stay_independent(tmp_path):
    r = lint_imports(broken_copy(tmp_path, "check/reference.py", "from cpsim.paths import Knobs"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cpsim.check.reference -> cpsim.paths" in r.stdout


def test_no_cycle_between_parts_of_cpsim():
    assert cycles(ROOT, 2) == []


def test_no_cycle_between_modules():
    assert cycles(ROOT, 99) == []


def test_a_cycle_inside_a_package_is_seen(tmp_path):
    """Two modules of one package importing each other (the catalogue's type reaching back for the
    catalogue): no contract between layers sees it, the module-level count does."""
    root = broken_copy(tmp_path, "faults/fault.py", "def _late():\n    from cpsim.faults import catalogue\n    return catalogue")
    assert cycles(root, 2) == []
    assert cycles(root, 99) == [{"cpsim.faults.catalogue", "cpsim.faults.fault"}]
    root = broken_copy(tmp_path / "paths", "paths/types.py", "from cpsim.paths import v1  # the path's types reaching up")
    assert cycles(root, 99) == [{"cpsim.paths.types", "cpsim.paths.v1"}]


def test_an_upward_import_is_seen_as_a_cycle(tmp_path):
    root = broken_copy(tmp_path, "layout.py", "import cpsim.cli")
    found = cycles(root, 2)
    assert len(found) == 1 and {"cpsim.layout", "cpsim.cli", "cpsim.run"} <= found[0]


def test_planned_packages_fit_their_layers(tmp_path):
    """``cpsim.stack`` (vLLM host classes per rank) sits beside fuzz and capture and may use run and
    report; ``cpsim.check.profiles`` (release profiles) is plain data inside the oracle."""
    root = broken_copy(tmp_path, "layout.py", "")
    (root / "cpsim" / "stack").mkdir(exist_ok=True)
    (root / "cpsim" / "stack" / "__init__.py").write_text("from cpsim.report import report\nfrom cpsim.run import world\n")
    (root / "cpsim" / "check" / "profiles.py").write_text("from cpsim.scenario import Scenario\nPROFILES = {}\n")
    r = lint_imports(root)
    assert r.returncode == 0, r.stdout + r.stderr
    (root / "cpsim" / "stack" / "__init__.py").write_text("from cpsim.fuzz import space\n")  # siblings stay apart
    r = lint_imports(root)
    assert r.returncode == 1 and "cpsim.stack -> cpsim.fuzz" in r.stdout, r.stdout + r.stderr


MAX_MODULE_LINES = 500  # a module holds one role (docs/ARCHITECTURE.md)


def modules_over(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_module_is_over_500_lines():
    assert modules_over(ROOT / "cpsim") == []


def test_a_module_over_500_lines_is_named(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "small.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert modules_over(tmp_path) == [f"pkg/big.py: {MAX_MODULE_LINES + 1} lines"]
