"""Profiles built from a model's own files: one module per kind of source.

- :mod:`~te_align.profiles.sources.folder`: a diffusers-format folder (``model_index.json`` + configs);
- :mod:`~te_align.profiles.sources.hub`: a Hugging Face hub repo (its small config files only);
- :mod:`~te_align.profiles.sources.checkpoint`: a single-file ``.safetensors`` checkpoint (its header only);
- :mod:`~te_align.profiles.sources.common`: the build report, the recipe table and the collector they share.

Which of them a string names is decided in one place, :func:`te_align.profiles.resolve.classify`,
used by both :func:`te_align.profile` and ``te-align profile build``. Only JSON files and safetensors
headers are read: nothing here imports torch, transformers or diffusers.
"""
