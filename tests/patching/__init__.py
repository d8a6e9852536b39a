"""Tests of te_align.patching: the patch transaction, its safety and faults, installs into a trainer's venv."""
