"""Tests of te_align.trainers.kohya (sd-scripts)."""
