"""Experiments as data: ablation specs and plans, the Ray engine, the staged driver, the run archive, builds of the
pipeline, rescoring, and Optuna sweeps (study specs, storage, trials)."""
