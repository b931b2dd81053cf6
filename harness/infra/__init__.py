"""Infrastructure: MLflow tracking, outside services checked with deadlines, and what may be printed or written
(safety)."""
