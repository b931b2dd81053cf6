"""Statistics behind the verdicts: calibrated tests (stats), verdicts per claim (verdicts), the group-sequential
rule (sequential) and its calibration (calibrate), and the gold–KL frontier (frontier)."""
