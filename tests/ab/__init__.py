"""Tests of te_align.ab: presets, the effects matrix and its evidence, pairing, progress and report."""
