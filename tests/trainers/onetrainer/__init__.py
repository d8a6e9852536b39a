"""Tests of te_align.trainers.onetrainer."""
