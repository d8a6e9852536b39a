"""Tests of te_align.trainers.musubi (musubi-tuner)."""
