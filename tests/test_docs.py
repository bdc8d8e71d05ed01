"""The docs run: every command block marked runnable in README.md and docs/*.md is executed.

A block is runnable when the line just before its opening fence is
`<!-- runnable -->` (options: `<!-- runnable timeout=120 -->`). Each line of the block
is one shell command (a trailing `\\` continues it); a command whose comment starts
with `exit N` must exit N, every other command must exit 0. A ```python block is one
script that must exit 0. The commands of a block
run in order in one bash, in a scratch directory holding a copy of docs/, examples/ and
tests/kernels/ (so a command that writes docs/img/... writes the copy), with `cpsim`,
`python` and `pytest` on PATH meaning this interpreter and this tree, on CPU (the
Triton interpreter). Blocks are parametrized one test each, so pytest-xdist spreads them.

Also: every relative link of those pages names a file that exists, the front-page
limits hold, and `--help` carries no reST markup.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*runnable(?P<opts>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)")
EXPECT = re.compile(r"#\s*exit\s+(\d+)\b")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DEFAULT_TIMEOUT = 120
# Pages other work is writing at the same time: a link to one is checked once the file exists.
PENDING = {"docs/ARCHITECTURE.md", "docs/UPSTREAM.md"}


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    commands: tuple[str, ...]
    timeout: int
    python: str | None = None   # a ```python block: its source

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(text: str, page: str) -> list[Block]:
    """The runnable blocks of one markdown page, in order."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        opts = dict(o.split("=", 1) for o in m["opts"].split())
        unknown = set(opts) - {"timeout"}
        assert not unknown, f"{page}:{i + 1}: unknown runnable option(s) {sorted(unknown)}"
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        assert fence, f"{page}:{i + 1}: <!-- runnable --> must be followed at once by a fenced block"
        body, j = [], i + 2
        while j < len(lines) and not lines[j].startswith(fence["fence"]):
            body.append(lines[j])
            j += 1
        assert j < len(lines), f"{page}:{i + 2}: the runnable block is never closed"
        timeout = int(opts.get("timeout", DEFAULT_TIMEOUT))
        if lines[i + 1][len(fence["fence"]):].strip().startswith("python"):
            found.append(Block(page, i + 2, ("python docs-block.py",), timeout, "\n".join(body) + "\n"))
        else:
            found.append(Block(page, i + 2, tuple(_commands(body)), timeout))
        i = j + 1
    return found


def _commands(body: list[str]) -> list[str]:
    """Lines joined at trailing backslashes; blank and comment-only lines dropped."""
    out, cur = [], ""
    for line in body:
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def expected_exit(command: str) -> int:
    """`# exit N ...` after a command: it must exit N (0 otherwise)."""
    comment = command.split(" #", 1)[1] if " #" in command else ""
    m = EXPECT.match("#" + comment) if comment else None
    return int(m[1]) if m else 0


def script(block: Block) -> str:
    """A bash script that runs the block's commands in order and stops at the first wrong exit code."""
    out = ["set -u"]
    for cmd in block.commands:
        want = expected_exit(cmd)
        quoted = cmd.replace("'", "'\\''")
        out.append(f"echo '$ {quoted}'")
        out.append(cmd)
        out.append(f"rc=$?; if [ $rc -ne {want} ]; then echo \"doc-test: exit $rc, expected {want}: "
                   f"{_dq(cmd)}\" >&2; exit 99; fi")
    return "\n".join(out) + "\n"


def _dq(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


def scratch(tmp: Path) -> dict[str, str]:
    """A working directory like the repository's root, and an environment whose cpsim is this tree."""
    shutil.copytree(ROOT / "docs", tmp / "docs")
    shutil.copytree(ROOT / "examples", tmp / "examples")
    shutil.copytree(ROOT / "tests" / "kernels", tmp / "tests" / "kernels")
    for name in ("data", "launch", "scripts", "Makefile", "pyproject.toml"):
        (tmp / name).symlink_to(ROOT / name)
    bin_dir = tmp / ".bin"
    bin_dir.mkdir()
    for name, run in (("cpsim", "-m cpsim"), ("pytest", "-m pytest -p no:cacheprovider"), ("python", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CPSIM_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), TRITON_INTERPRET="1",
               PY=sys.executable,
               CUDA_VISIBLE_DEVICES="", HOME=str(tmp))
    return env


def run_block(block: Block, tmp: Path) -> subprocess.CompletedProcess:
    env = scratch(tmp)
    if block.python is not None:
        (tmp / "docs-block.py").write_text(block.python)
    proc = subprocess.Popen(["bash", "-c", script(block)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=block.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{block.id}: still running after {block.timeout} s\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of one page whose file does not exist (links into PENDING pages skipped while absent)."""
    text = re.sub(r"^(```+|~~~+).*?^\1", "", page.read_text(), flags=re.S | re.M)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        rel = os.path.relpath(path, root)
        if not path.exists() and rel not in PENDING:
            bad.append(target)
    return bad


def command_key(command: str) -> tuple[str, int]:
    return command.split(" #", 1)[0].strip(), expected_exit(command)


def covered(all_blocks: list[Block]) -> dict[str, str]:
    """{block id: id of an earlier block}: blocks whose every command an earlier block already runs.

    The same commands on two pages (README's and the kernel guide's) run once."""
    seen: dict[tuple[str, int], str] = {}
    out = {}
    for b in all_blocks:
        keys = [command_key(c) for c in b.commands]
        if b.python is None and keys and all(k in seen for k in keys):
            out[b.id] = seen[keys[0]]
        for k in keys:
            seen.setdefault(k, b.id)
    return out


ALL_BLOCKS = [b for p in pages() for b in blocks(p.read_text(), str(p.relative_to(ROOT)))]
COVERED = covered(ALL_BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_runnable_block(block: Block, tmp_path: Path):
    if block.id in COVERED:
        assert COVERED[block.id] in {b.id for b in ALL_BLOCKS}
        return  # the same commands ran in the earlier block
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block.id} failed (exit {done.returncode}):\n{done.stdout[-6000:]}"


def test_there_are_runnable_blocks():
    assert len(ALL_BLOCKS) >= 10
    assert any(b.page == "README.md" for b in ALL_BLOCKS)


# Generated or data pages the docs link to: their links (the matrix's repros) are checked too.
DATA_PAGES = (ROOT / "data" / "README.md", ROOT / "data" / "upstream" / "matrix.md", ROOT / "data" / "bugs" / "matrix.md")


@pytest.mark.parametrize("page", [*pages(), *DATA_PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_exist(page: Path):
    assert broken_links(page) == []


def test_front_page_limits():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 10 * 1024
    assert len((ROOT / "docs" / "BENCHMARKS.md").read_text().encode()) <= 15 * 1024
    first = next(b for b in re.findall(r"```[^\n]*\n(.*?)```", readme, re.S))
    assert [c.split("#")[0].strip() for c in _commands(first.splitlines())] == ["make run", "make test"]


# Prose under docs/ (every page, `du -cb docs/*.md`): issue 36's 150 KB. Lower it as the pages shrink.
PROSE_LIMIT = 150_000


def prose_bytes(docs: Path) -> int:
    return sum(len(p.read_bytes()) for p in docs.glob("*.md"))


def test_docs_prose_within_limit():
    assert prose_bytes(ROOT / "docs") <= PROSE_LIMIT


def unmapped(readme: str, docs: Path) -> list[str]:
    """Pages under docs/ that README's "Map of docs/" table does not list."""
    section = readme.split("## Map of docs/", 1)[1]
    listed = set(re.findall(r"\]\(docs/([A-Z_]+\.md)\)", section))
    return sorted(p.name for p in docs.glob("*.md") if p.name not in listed)


def test_readme_map_lists_every_page():
    assert unmapped((ROOT / "README.md").read_text(), ROOT / "docs") == []


def test_unmapped_page_is_found(tmp_path: Path):
    for name in ("A.md", "B.md"):
        (tmp_path / name).write_text("x")
    readme = "# x\n## Map of docs/\n| [A.md](docs/A.md) | a |\n"
    assert unmapped(readme, tmp_path) == ["B.md"]
    assert prose_bytes(tmp_path) == 2


NAMED_PATH = re.compile(r"(?<![\w/.])(?:docs/(?:[A-Z_]+\.md|img/[\w.-]*\w)|(?:data|examples)/[\w./-]*\w)")
CODE = ("cpsim", "scripts", "tests", "launch", ".ci", "Makefile", "pyproject.toml")


def missing_paths(root: Path) -> list[str]:
    """docs/, data/ and examples/ paths that code, scripts, tests and build files name but that do not exist."""
    files = [f for name in CODE for f in ([root / name] if (root / name).is_file() else (root / name).rglob("*"))
             if f.is_file() and f.suffix in ("", ".py", ".sh", ".toml", ".cfg") and f.name != "test_docs.py"
             and "__pycache__" not in f.parts]
    named = {m for f in files for m in NAMED_PATH.findall(f.read_text(errors="replace"))}
    return sorted(n for n in named if not (root / n).exists())


def test_paths_named_in_code_exist():
    assert missing_paths(ROOT) == []


def test_missing_path_is_found(tmp_path: Path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "kept.json").write_text("{}")
    (tmp_path / "scripts" / "s.py").write_text('A = "data/kept.json"\nB = "docs/GONE.md"\nC = "data/bench/gone.json"\n'
                                                 'D = "examples/gone.json"\n')
    assert missing_paths(tmp_path) == ["data/bench/gone.json", "docs/GONE.md", "examples/gone.json"]


def stray_data(docs: Path) -> list[str]:
    """Files under docs/ that are neither a page nor an image it shows (examples live in examples/)."""
    return sorted(str(p.relative_to(docs)) for p in docs.rglob("*") if p.is_file()
                  and not (p.parent == docs and p.suffix == ".md")
                  and p.relative_to(docs).parts[0] != "img")


def test_docs_hold_no_data():
    assert stray_data(ROOT / "docs") == [], "data belongs in data/ (data/README.md), not docs/"


def test_stray_data_is_found(tmp_path: Path):
    for name in ("A.md", "examples/x.json", "img/y.png", "bench/raw.json", "known.json", "runs/r/README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert stray_data(tmp_path) == ["bench/raw.json", "examples/x.json", "known.json", "runs/r/README.md"]


def sample_rows(readme: str) -> list[str]:
    """The invariant column of README's "What `make run` prints" table."""
    section = readme.split("## What `make run` prints", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^│ ([a-z-]+) +│", section, re.M)


def test_readme_sample_lists_every_invariant():
    from cpsim.check.coordinator import INVARIANTS
    assert sample_rows((ROOT / "README.md").read_text()) == list(INVARIANTS)
    stale = "## What `make run` prints\n```\n│ kernel-completes  │ pass │\n│ padding           │ pass │\n```\n"
    assert sample_rows(stale) != list(INVARIANTS)


def test_help_has_no_rst_markup():
    from cpsim.cli import build_parser
    parser = build_parser()
    texts = [parser.format_help()]
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for sub in subs.choices.values():
        texts.append(sub.format_help())
        inner = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        texts += [s.format_help() for a in inner for s in a.choices.values()]
    assert len(texts) > 8
    assert [t.splitlines()[0] for t in texts if "``" in t] == []


# The harness itself, on broken input: each of its checks fails when it should.

def test_harness_catches_a_wrong_exit_code(tmp_path: Path):
    md = "<!-- runnable timeout=30 -->\n```\ntrue\nsh -c 'exit 3'    # exit 3: expected\nsh -c 'exit 1'\n```\n"
    (block,) = blocks(md, "fake.md")
    assert [expected_exit(c) for c in block.commands] == [0, 3, 0]
    done = run_block(block, tmp_path)
    assert done.returncode == 99
    assert "doc-test: exit 1, expected 0: sh -c 'exit 1'" in done.stdout


def test_harness_joins_continuations_and_runs_cpsim_of_this_tree(tmp_path: Path):
    md = ("text\n<!-- runnable -->\n```bash\n# a comment\nK=examples/small-cp4.json\n"
          "test -f \\\n  $K\npython -c 'import cpsim, sys; sys.exit(0 if cpsim.__file__.startswith(sys.argv[1]) else 1)'"
          f" {ROOT}\n```\n\n```\nnot runnable\n```\n")
    (block,) = blocks(md, "fake.md")
    assert block.commands[1] == "test -f    $K"
    assert run_block(block, tmp_path).returncode == 0


def test_harness_runs_a_python_block(tmp_path: Path):
    md = "<!-- runnable -->\n```python\nimport sys\nprint('hello')\nsys.exit(4)\n```\n"
    (block,) = blocks(md, "fake.md")
    done = run_block(block, tmp_path)
    assert done.returncode == 99 and "hello" in done.stdout and "exit 4, expected 0" in done.stdout


def test_harness_runs_the_same_commands_once():
    md = ("<!-- runnable -->\n```\na --x   # one\nb\n```\n<!-- runnable -->\n```\nb  # two\na --x\n```\n"
          "<!-- runnable -->\n```\na --x\nc\n```\n<!-- runnable -->\n```\nb   # exit 1\n```\n")
    found = blocks(md, "fake.md")
    assert covered(found) == {found[1].id: found[0].id}


def test_harness_refuses_a_marker_without_a_block():
    with pytest.raises(AssertionError, match="must be followed"):
        blocks("<!-- runnable -->\ntext\n", "fake.md")


def test_link_check_catches_a_missing_file(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("x")
    page = tmp_path / "README.md"
    page.write_text("[a](docs/A.md) [b](docs/B.md#x) [w](https://example.org/) [s](#top) ![i](docs/img/no.png) "
                    "[p](docs/ARCHITECTURE.md) `k[grid](...)`\n```\nf[x](y)\n```\n")
    assert broken_links(page, tmp_path) == ["docs/B.md#x", "docs/img/no.png"]
