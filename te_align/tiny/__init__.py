"""Offline tiny parts: tokenizers, encoders, models and the procedural shapes world."""
