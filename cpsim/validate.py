"""One door for input: files and CLI values are checked against ``cpsim.schema`` before any work starts.

Every refusal is a ``ConfigError`` (exit 2, one line, no traceback) that names the
field, the rule and, for an unknown key, the closest allowed one. Output paths are
probed before the run so a long check is never computed and then lost; writes at
the end are isolated so one failing output does not take the others with it.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any, Callable

from cpsim import scenario as sc
from cpsim import schema
from cpsim.errors import ConfigError
from cpsim.parsing import _show, parse

MAX_FILE_BYTES = 64 << 20   # no scenario or repro file comes near this; refuse to slurp a disk image
OUTPUT_OPTIONS = ("json", "html", "junit", "dump")
# Every option of every subcommand that names a file or directory (argparse dest -> how the user wrote
# it); each is checked by ``check_path`` before any work. ``tests/test_bad_input.py`` walks the parser
# to keep this table complete.
PATH_OPTIONS = {
    "scenario": "--scenario", "json": "--json", "html": "--html", "junit": "--junit", "dump": "--dump",
    "out": "--out", "shrink": "--shrink", "db": "--db", "known": "--known", "config": "--config",
    "repro": "--repro", "capture": "--capture", "file": "FILE", "stack_classes": "--stack-classes",
    "stack_python": "--stack-python", "stack_source": "--stack-source", "ascend_python": "--ascend-python",
}
LIST_PATH_OPTIONS = {"presets": "--presets"}  # comma-separated, each entry a preset name or a file
SPEC_OPTIONS = {"kernel_v1": "--kernel-v1", "kernel_v1_fused": "--kernel-v1-fused", "kernel_v2": "--kernel-v2",
                "kernel_replay": "--kernel-replay", "sizing": "--sizing"}  # path/to/file.py:attr: the file part


# ---- reading files ---------------------------------------------------------------------

class _Duplicate(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _first_nonfinite(data: Any, where: str) -> str | None:
    if isinstance(data, float) and not math.isfinite(data):
        return where
    if isinstance(data, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in data.items())
    elif isinstance(data, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    for w, v in items:
        found = _first_nonfinite(v, w)
        if found is not None:
            return found
    return None


def read_data(path: str | Path, what: str = "scenario", noun: str | None = None) -> dict:
    """A JSON / TOML file as a dict: refused when it is not a readable text file holding one object.

    Any other suffix than ``.toml`` is read as JSON. NaN / inf (which Python's JSON and
    TOML readers both accept) are refused wherever they appear, as are duplicate JSON keys.
    ``what`` names the option in errors, ``noun`` the kind of file (default: ``what``).
    """
    noun = noun or what
    p = Path(path)
    if not p.exists():
        raise ConfigError(what, f"file {p} does not exist")
    if p.is_dir():
        raise ConfigError(what, f"{p} is a directory, not a file")
    if not p.is_file():
        raise ConfigError(what, f"{p} is not a regular file")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(what, f"{p} is {size} bytes; {noun} files are far below {MAX_FILE_BYTES >> 20} MiB")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(what, f"cannot read {p}: {e.strerror or e}") from None
    kind = "TOML" if p.suffix == ".toml" else "JSON"
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "NUL byte")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(what, f"{p} is not a text file (binary data); expected {kind}") from None
    try:
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(what, f"{p} is not valid {kind}: {e}") from None
    except _Duplicate as e:
        raise ConfigError(what, f"{p}: key {e.args[0]!r} appears twice in one object") from None
    except RecursionError:
        raise ConfigError(what, f"{p} nests too deeply to be a {noun} file") from None
    if not isinstance(data, dict):
        raise ConfigError(what, f"{p} must hold one {kind} object of {noun} fields, got {_show(data)}")
    bad = _first_nonfinite(data, "")
    if bad is not None:
        raise ConfigError(bad, f"NaN and infinity are not allowed; use a finite number (in {p})")
    return data


def load_scenario(path: str | Path):
    """A scenario file, or the scenario a repro file wraps (``{"scenario": {...}, "knobs": ...}``)."""
    data = read_data(path, "scenario")
    if "scenario" in data and "groups" not in data:
        m = parse(schema.ReproModel, data, "repro", str(path))
        return sc.Scenario.from_dict(m.scenario.model_dump())
    return sc.Scenario.from_dict(data, str(path))


def load_sweep_config(path: str | Path) -> dict[str, Any]:
    """``sweep --config FILE``: the matrix keys only, typed."""
    data = read_data(path, "--config", "sweep config")
    return parse(schema.SweepConfigModel, data, "config", str(path)).model_dump(exclude_none=True)


# ---- CLI values and output paths ----------------------------------------------------------

def check_args(args) -> None:
    """Bounds on the shared options, then every path (its length, no symlink loop), then every output
    path: all before any work starts."""
    values = {k: v for k, v in vars(args).items() if k in schema.CliValues.model_fields and v is not None}
    parse(schema.CliValues, values, "", cli=True)
    for flag, value in given_paths(args):
        check_path(flag, value)
    check_outputs(output_paths(args))


def given_paths(args) -> list[tuple[str, str]]:
    """(flag, path) of every file or directory the command line names (``PATH_OPTIONS`` and the rest)."""
    out = [(flag, v) for dest, flag in PATH_OPTIONS.items() if isinstance(v := getattr(args, dest, None), str)]
    for dest, flag in LIST_PATH_OPTIONS.items():
        if isinstance(v := getattr(args, dest, None), str):
            out += [(flag, part.strip()) for part in v.split(",") if part.strip()]
    for dest, flag in SPEC_OPTIONS.items():
        v = getattr(args, dest, None)
        if isinstance(v, str) and ":" in v:
            module = v.rpartition(":")[0]
            if module.endswith(".py") or "/" in module or "\\" in module:
                out.append((flag, module))
    return out


def _limit(name: str, fallback: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError, AttributeError):
        return fallback


def _short(path: str, keep: int = 60) -> str:
    return path if len(path) <= keep else f"{path[: keep // 2]}...{path[-keep // 2:]}"


def check_path(flag: str, path: str) -> None:
    """A path the system can look up: no name longer than NAME_MAX bytes, the whole shorter than
    PATH_MAX, and no symlink loop on the way (each would otherwise surface as an OSError traceback
    wherever the path is first opened)."""
    import errno
    name_max, path_max = _limit("PC_NAME_MAX", 255), _limit("PC_PATH_MAX", 4096)
    size = len(os.fsencode(path))
    if size >= path_max:
        raise ConfigError(flag, f"path of {size} bytes ({_short(path)}) is too long: at most {path_max - 1}")
    longest = max((len(os.fsencode(part)) for part in path.split(os.sep)), default=0)
    if longest > name_max:
        raise ConfigError(flag, f"a name of {longest} bytes in {_short(path)} is too long: a file or directory "
                                f"name has at most {name_max}")
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(flag, f"{path} is a symlink loop (too many levels of symbolic links)") from None
        if e.errno == errno.ENAMETOOLONG:
            raise ConfigError(flag, f"{_short(path)} is too long for its file system") from None


def output_paths(args) -> dict[str, str]:
    """{flag: path} of the files this command will write."""
    out = {f"--{k}": getattr(args, k) for k in OUTPUT_OPTIONS if isinstance(getattr(args, k, None), str)}
    if getattr(args, "command", None) == "draw" and isinstance(getattr(args, "out", None), str):
        out["--out"] = args.out
    return out


def check_outputs(outputs: dict[str, str]) -> None:
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        check_writable(flag, path)
        key = Path(path).resolve()
        if key in seen:
            raise ConfigError(flag, f"{path} is also given to {seen[key]}; one file cannot hold both")
        seen[key] = flag


def check_writable(flag: str, path: str) -> None:
    """Refuse a path that cannot be written: a directory, a missing parent, no permission.

    Probes by opening (an existing file in append mode, which changes nothing; a new
    name through a uniquely named scratch file) because permission bits lie to root.
    """
    if not path.strip():
        raise ConfigError(flag, "is empty; give a file name")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, f"{p} is a directory; give a file name")
    parent = p.parent
    if not parent.exists():
        raise ConfigError(flag, f"cannot write {p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ConfigError(flag, f"cannot write {p}: {parent} is not a directory")
    try:
        if p.exists():
            with open(p, "ab"):
                pass
        else:
            probe = parent / f".{p.name}.{os.getpid()}.cpsim-probe"
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            probe.unlink()
    except OSError as e:
        raise ConfigError(flag, f"cannot write {p}: {e.strerror or e}") from None


def write_outputs(writers: list[tuple[str, str | None, Callable[[], Any]]]) -> None:
    """Call every writer whose path is set, even when an earlier one fails; then report the failures.

    A write can still fail after the precheck (disk full, a directory removed during the
    run); the outputs that can be written are, and the command exits 2 naming the rest.
    """
    failed, written = [], []
    for flag, path, write in writers:
        if not path:
            continue
        try:
            write()
            written.append(flag)
        except OSError as e:
            failed.append((flag, f"cannot write {path}: {e.strerror or e}"))
    if failed:
        rest = f" ({', '.join(written)} written)" if written else ""
        raise ConfigError(", ".join(f for f, _ in failed), "; ".join(why for _, why in failed) + rest)


# ---- CP world size -----------------------------------------------------------------------

def check_world(s, allow_large: bool) -> None:
    """The virtual world runs every rank in turn in one process: large worlds need asking for."""
    if s.cp.world > schema.LARGE_WORLD and not allow_large:
        raise ConfigError("cp", f"CP world size {s.cp.world} (DCP {s.cp.dcp} x PCP {s.cp.pcp}) is above "
                                f"{schema.LARGE_WORLD}: the virtual world runs every rank in turn, which takes "
                                f"minutes; pass --allow-large to run it anyway")
