"""Tests of te_align.probe: `te-align probe` / `matrix`."""
