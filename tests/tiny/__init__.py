"""Tests of te_align.tiny: the offline tiny world, its bases and the tools that pretrain them."""
