"""Tests of te_align.train: `te-align train` (families, export, faults, scale, distributed, threads)."""
