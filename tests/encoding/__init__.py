"""Tests of te_align.encoding: te_align.encode, parity with the official pipelines, prompt weights, the cache."""
