"""Tests of te_align.trainers.diffusers_examples."""
