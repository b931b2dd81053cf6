"""The RL core: the PPO loop (ppo), its rollout batch (batch), sampling (rollout), the run's models (run_models,
models), the held-out evaluation, the metrics a run records, and the registered components."""
