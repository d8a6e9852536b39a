"""Tests of te_align.trainers.simpletuner."""
