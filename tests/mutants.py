"""One-line mutants of the test kernels: a copy of a kernel file with one exact edit."""

from __future__ import annotations

from pathlib import Path


def mutant(tmp_path: Path, spec: str, old: str, new: str) -> str:
    """The spec (``file:attr``) of a copy of ``spec``'s file in which ``old`` (found exactly once) reads ``new``."""
    file, attr = spec.rsplit(":", 1)
    text = Path(file).read_text()
    assert text.count(old) == 1, old
    out = tmp_path / f"bug_{Path(file).name}"
    out.write_text(text.replace(old, new))
    return f"{out}:{attr}"
