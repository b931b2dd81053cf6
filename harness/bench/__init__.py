"""Benchmarks and the GPU check: our loop against TRL's PPOTrainer (loop, trl, venv, spec), the reasoning
testbed (reasoning), sweep throughput (sweep), and gpu_check."""
