"""Tests of te_align.audit: `te-align check` and `--fix` across trainers (detection, datasets, policy, reach)."""
