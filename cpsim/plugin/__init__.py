"""A user's kernel in place of ours: ABI detection, argument adapters, the pytest plugin, the vLLM shim."""
