"""Tests of te_align.hooks: the shared hook machinery."""
