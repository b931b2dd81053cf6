"""PPO ablation harness: every implementation detail of PPO for language models is a named,
swappable component plugged into one loop."""

import os as _os

# OpenMP threads that spin while waiting steal the CPU from other worker processes on a shared
# machine (measured: a 0.3 s fwd+bwd took 3.5 s under load). Must be set before torch loads.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
