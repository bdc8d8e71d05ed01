import os

# The Triton interpreter must be chosen before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("cpsim", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cpsim")
