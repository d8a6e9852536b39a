"""Tests of te_align.swap: `te-align swap` and its study driver."""
