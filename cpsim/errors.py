"""Errors a user can act on. The CLI prints them without a traceback (exit 2)."""


class ConfigError(ValueError):
    """Bad input: names the field and the rule it breaks."""

    def __init__(self, field: str, rule: str):
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class DistError(RuntimeError):
    """A distributed run could not go on (missing rank, timeout, no backend)."""


class Interrupted(BaseException):
    """SIGTERM (or SIGINT) during a command: ends it like Ctrl-C, with one line and exit 128 + signal.

    Here, the lowest layer, so that a command below the CLI (``cpsim.fuzz``) can keep what it found
    when one goes through it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
