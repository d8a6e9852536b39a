"""Tests of te_align.profiles: the profile model, sources, bundled profiles, overrides, faults."""
