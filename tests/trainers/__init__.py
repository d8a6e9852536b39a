"""Tests of te_align.trainers: the registry and contract, and tests spanning several trainers' rule tables."""
