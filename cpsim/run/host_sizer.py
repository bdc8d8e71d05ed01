"""``--sizing SPEC``: a host sizing function's answers, with the user's code kept out of this process.

SPEC is a built-in name (``cpsim.sizing.BUILTIN``: ``cpsim``, ``vllm-0.33``, ``vllm-ascend-0.23``),
``path/to/file.py:fn`` or ``package.module:fn``. A built-in is cpsim's own code and is called
here. A user's function is user code (issue 27: it never runs where its output is judged), so
it runs in a child process (:mod:`cpsim.run.sizing_child`) of its own session, handed plain
JSON and answering plain JSON, each answer bounded in time; whatever it patches at import dies
with the child. One child serves every scenario of a command (a fuzz search asks thousands),
and answers are kept per host input: scenarios that differ only in their batch or caches ask once.
What it answered is read by :func:`cpsim.sizing.read_answer` here.

A SPEC that is malformed or names a missing file or module is bad input (ConfigError, exit 2);
a function that raises, exits, hangs, crashes or answers garbage is a :class:`SizingFailure`
(exit 1, named).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpsim import sizing
from cpsim.errors import ConfigError
from cpsim.scenario import Scenario

TIMEOUT_S = 60.0
WHERE = "--sizing"
MEMO = 4096  # host inputs whose answers are kept
_BOOT = "import sys; sys.path[0] = sys.argv[1]; from cpsim.run.sizing_child import main; main(*sys.argv[2:])"
_ROOT = str(Path(__file__).resolve().parents[2])


class SizingFailure(Exception):
    """The sizing function under test did not answer usable plain data; the message names it."""


def check_spec(spec: str, where: str = WHERE) -> str:
    """SPEC in the form the child imports (a file made absolute); ConfigError naming ``where`` when malformed."""
    if spec in sizing.BUILTIN:
        return spec
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr or not attr.isidentifier():
        raise ConfigError(where, f"{spec!r} is not a built-in ({', '.join(sizing.BUILTIN)}), "
                                 f"path/to/file.py:function nor package.module:function")
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        file = Path(module_part)
        if not file.is_file():
            raise ConfigError(where, f"sizing file {file} does not exist")
        return f"{file.resolve()}:{attr}"
    if not all(part.isidentifier() for part in module_part.split(".")):
        raise ConfigError(where, f"{module_part!r} is not a module name")
    return spec


def check_timeout(seconds: float) -> float:
    import math
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError("--sizing-timeout", f"must be a number of seconds > 0, got {seconds}")
    return seconds


class Sizer:
    """What SPEC gives each host of a scenario, asked scenario by scenario (``answer``).

    A user's function runs in one long-lived child; a child that failed (hung past ``timeout``,
    exited, crashed) is ended and the next question starts a fresh one. ``close`` ends it."""

    def __init__(self, spec: str, timeout: float = TIMEOUT_S, where: str = WHERE):
        self.spec, self.where = spec, where
        self.target = check_spec(spec, where)
        self.timeout = check_timeout(timeout)
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._memo: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._unloadable: Exception | None = None  # its import failed: every answer fails so, no new child

    def __enter__(self) -> "Sizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def builtin(self) -> bool:
        return self.target in sizing.BUILTIN

    def check(self) -> None:
        """Load the function now: a module or attribute that is not there is ConfigError (exit 2)
        before any scenario runs; an import that fails is the function's SizingFailure."""
        if not self.builtin:
            self._child()

    def answer(self, s: Scenario, paths) -> tuple[sizing.HostSizing, ...]:
        """One HostSizing per host the selected ``paths`` run on (that the SPEC sizes)."""
        hosts = [h for h in dict.fromkeys(sizing.host_of(p) for p in paths)
                 if h in sizing.BUILTIN_HOSTS.get(self.target, (h,))]
        inputs = [sizing.host_input(s, h) for h in hosts]
        if self.builtin:
            answers = [sizing.BUILTIN[self.target](dict(h)) for h in inputs]
        else:
            answers = self._ask(inputs)
        out = []
        for h, a in zip(inputs, answers):
            try:
                out.append(sizing.read_answer(a, h, self.spec))
            except ValueError as e:
                raise SizingFailure(f"sizing function {self.spec} (host {h['host']}) {e}") from None
        return tuple(out)

    def _ask(self, inputs: list[dict]) -> list:
        key = json.dumps(inputs, sort_keys=True)
        if key not in self._memo:
            try:
                self._memo[key] = self._request(key)
            except SizingFailure as e:
                self._memo[key] = e
            if len(self._memo) > MEMO:
                self._memo.popitem(last=False)
        got = self._memo[key]
        if isinstance(got, SizingFailure):
            raise SizingFailure(str(got))
        if not isinstance(got, list) or len(got) != len(inputs):
            raise SizingFailure(f"sizing function {self.spec} did not answer once per host")
        return got

    def _request(self, line: str) -> list:
        proc = self._child()
        try:
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died: the read below says how
        reply = self._reply("answered")
        if "failed" in reply:
            raise SizingFailure(f"sizing function {self.spec} {reply['failed']}")
        return reply.get("answers")

    def _child(self) -> subprocess.Popen:
        if self._proc is not None:
            return self._proc
        if self._unloadable is not None:
            raise self._unloadable
        self._log = tempfile.TemporaryFile(prefix="cpsim-sizing-")
        self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, _ROOT, self.target, str(os.getpid())],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      start_new_session=True)
        atexit.register(self.close)  # a child still running ends when cpsim exits
        try:
            reply = self._reply("loaded")
        except SizingFailure as e:  # its import hung, exited or crashed
            self._unloadable = e
            raise
        if "config" in reply or "failed" in reply:
            self.close()
            self._unloadable = (ConfigError(self.where, str(reply["config"])) if "config" in reply else
                                SizingFailure(f"sizing function {self.spec} {reply['failed']}"))
            raise self._unloadable
        return self._proc

    def _reply(self, deed: str) -> dict:
        """The child's next line, within ``timeout``; a SizingFailure (child ended) otherwise."""
        proc = self._proc
        fd, buf, end = proc.stdout.fileno(), b"", time.monotonic() + self.timeout
        while not buf.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise SizingFailure(f"sizing function {self.spec} ran past {self.timeout:g} s and was killed")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._ended(deed)
            buf += chunk
        try:
            reply = json.loads(buf)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise SizingFailure(f"sizing function {self.spec}: its process wrote an unreadable answer")
        return reply

    def _ended(self, deed: str) -> SizingFailure:
        proc = self._proc
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        tail = self._tail()
        self.close()
        how = ("closed its pipe" if code is None else
               f"was killed by signal {-code}" if code < 0 else f"exited {code}")
        return SizingFailure(f"sizing function {self.spec} {how} before it {deed}" + (f": {tail}" if tail else ""))

    def _tail(self) -> str:
        try:
            self._log.seek(0)
            text = self._log.read()[-4000:].decode(errors="replace")
        except (OSError, ValueError, AttributeError):
            return ""
        return " | ".join(text.strip().splitlines()[-3:])

    def close(self) -> None:
        """End the child and whatever it forked (its own session)."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.close)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        if self._log is not None:
            self._log.close()
            self._log = None


def resolve(spec: str, s: Scenario, paths: list[str], timeout: float = TIMEOUT_S,
            where: str = WHERE) -> tuple[sizing.HostSizing, ...]:
    """The sizing SPEC gives each host the selected ``paths`` run on (one answer per host), once."""
    with Sizer(spec, timeout, where) as z:
        return z.answer(s, paths)
