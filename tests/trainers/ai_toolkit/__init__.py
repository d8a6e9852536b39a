"""Tests of te_align.trainers.ai_toolkit."""
