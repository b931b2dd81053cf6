"""Reports: an ablation's runs read back (runs), its numbers (summary), per-build effects (builds), figures
(plots), text from Jinja2 templates (render, templates/), the ablation report (ablation), the study report
(study), the scorecard over every ablation (scorecard) and verdict changes between revisions (changes)."""
