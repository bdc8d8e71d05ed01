"""cpsim: a simulation testbed for context-parallel KV-cache slot mapping."""

__version__ = "0.1.0"
