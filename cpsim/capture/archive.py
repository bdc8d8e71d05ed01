"""The on-disk container: a plain (uncompressed) zip of ``.npy`` arrays and ``.json`` members.

Why a zip and not ``np.savez``: members can be appended one launch at a time (a
capture never holds more than one launch in memory), the file stays readable
after every append (the central directory is rewritten on close), and ``.npy``
members of a stored zip are read back with one ``read`` each, so a 1M-token,
8-rank capture loads in well under a second. ``numpy.load`` opens the file too
(it is a valid ``.npz``; JSON members come back as bytes).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from cpsim import bounds
from cpsim.errors import ConfigError


class ArchiveWriter:
    """Append arrays and JSON to one zip; every ``flush`` leaves a valid file behind."""

    def __init__(self, path: str | Path, mode: str = "w"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._zf = zipfile.ZipFile(self.path, mode, zipfile.ZIP_STORED, allowZip64=True)
        self.bytes = self.path.stat().st_size if mode == "a" else 0

    def array(self, name: str, value: np.ndarray) -> None:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(value), allow_pickle=False)
        self._zf.writestr(name + ".npy", buf.getvalue())
        self.bytes += buf.tell()

    def json(self, name: str, value: Any) -> None:
        data = json.dumps(value, sort_keys=True).encode()
        self._zf.writestr(name + ".json", data)
        self.bytes += len(data)

    def close(self) -> None:
        self._zf.close()

    def __enter__(self) -> "ArchiveWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ArchiveReader:
    """Lazy access to the members of an archive written by :class:`ArchiveWriter`."""

    def __init__(self, path: str | Path, field: str = "file"):
        self.path = Path(path)
        self.field = field
        try:
            self._zf = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise ConfigError(field, f"{self.path} does not exist") from None
        except (zipfile.BadZipFile, OSError) as e:
            raise ConfigError(field, f"{self.path} is not a cpsim capture/batch archive ({e})") from None
        self.names = set(self._zf.namelist())

    def has(self, name: str) -> bool:
        return name + ".npy" in self.names or name + ".json" in self.names

    def entries(self, name: str) -> int:
        """The entries array ``name`` declares in its ``.npy`` header (read alone: nothing is allocated);
        ConfigError past ``bounds.MAX_ARRAY_ENTRIES``."""
        shape, _, _ = self._header(name)
        return bounds.array_fits(self.field, f"{self.path.name}: array {name!r}", shape)

    def array(self, name: str) -> np.ndarray:
        shape, dtype, start = self._header(name)
        n = bounds.array_fits(self.field, f"{self.path.name}: array {name!r}", shape)
        held = self._zf.getinfo(self._member(name)).file_size - start
        if dtype.hasobject or n * dtype.itemsize > held:  # refused before numpy allocates what it declares
            what = "Python objects" if dtype.hasobject else f"{n * dtype.itemsize} bytes of data, the member holds {held}"
            raise ConfigError(self.field, f"{self.path.name}: array {name!r} declares shape {tuple(shape)} of {dtype}: "
                                          f"{what}")
        with self._zf.open(self._member(name)) as f:
            try:
                return np.lib.format.read_array(f, allow_pickle=False)
            except ValueError as e:
                raise ConfigError(self.field, f"{self.path.name}: array {name!r} is unreadable ({e})") from None

    def _header(self, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
        """(shape, dtype, offset of the data) from the member's ``.npy`` header alone."""
        with self._zf.open(self._member(name)) as f:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f".npy format version {version[0]}.{version[1]} (cpsim reads 1.0 and 2.0)")
            except ValueError as e:
                raise ConfigError(self.field, f"{self.path.name}: array {name!r} is unreadable ({e})") from None
            return shape, dtype, f.tell()

    def _member(self, name: str) -> str:
        member = name + ".npy"
        if member not in self.names:
            raise ConfigError(self.field, f"{self.path.name}: array {name!r} is missing")
        return member

    def json(self, name: str) -> Any:
        member = name + ".json"
        if member not in self.names:
            raise ConfigError(self.field, f"{self.path.name}: {member} is missing")
        try:
            return json.loads(self._zf.read(member))
        except json.JSONDecodeError as e:
            raise ConfigError(self.field, f"{self.path.name}: {member} is not valid JSON ({e})") from None

    def close(self) -> None:
        self._zf.close()
