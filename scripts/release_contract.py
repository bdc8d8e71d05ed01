"""Print (or record) the content hashes of a release's contract files: the step that adds a read release.

``python scripts/release_contract.py PROJECT FOLDER [--record VERSION]``

FOLDER is the unpacked release: a ``pip install --target`` folder, an unpacked wheel or an sdist's top
folder. The files hashed are the table's ``path_files`` (cpsim/releases/PROJECT.json): the block-table
modules whole, the runners' launch lines (cpsim.releases.contract). ``--record VERSION`` writes them into
that release's ``files`` in the table (the release must be listed there already, with its paths, ABIs and
profiles read from its code).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpsim import releases  # noqa: E402
from cpsim.releases.contract import hashes  # noqa: E402


def contract_hashes(name: str, folder: Path) -> dict[str, str]:
    proj = releases.project(name)
    keys = list(dict.fromkeys(k for p in releases.PATHS for k in proj.path_files.get(p, [])))
    return hashes(folder, keys, proj.launch_calls)


def record(name: str, version: str, files: dict[str, str]) -> None:
    table = releases.HERE / releases.PROJECTS[name]
    data = json.loads(table.read_text())
    if version not in data["releases"]:
        raise SystemExit(f"{name} {version} is not listed in {table.relative_to(ROOT)}: add its paths first")
    data["releases"][version]["files"] = files
    table.write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("project", choices=sorted(releases.PROJECTS))
    ap.add_argument("folder", type=Path)
    ap.add_argument("--record", metavar="VERSION")
    args = ap.parse_args()
    if not args.folder.is_dir():
        print(f"folder: {args.folder} is not a folder", file=sys.stderr)
        return 2
    files = contract_hashes(args.project, args.folder)
    if args.record:
        record(args.project, args.record, files)
    print(json.dumps(files, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
