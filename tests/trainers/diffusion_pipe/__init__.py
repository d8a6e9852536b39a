"""Tests of te_align.trainers.diffusion_pipe."""
