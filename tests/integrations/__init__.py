"""Tests of te_align.integrations: te_align.apply, ComfyUI, Forge, `check --for`, LoRA metadata."""
