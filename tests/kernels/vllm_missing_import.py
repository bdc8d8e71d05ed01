"""A kernel file importing a vLLM module no released slot-mapping file imports (for the shim's error)."""

from vllm.v1.sample.sampler import Sampler  # noqa: F401
