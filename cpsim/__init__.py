"""cpsim: a simulation testbed for context-parallel KV-cache slot mapping."""

import time as _time

__version__ = "0.1.0"

# When this process started cpsim: distributed runs report each rank's start-up
# (imports, device and process-group set-up) from here.
STARTED = _time.time()
