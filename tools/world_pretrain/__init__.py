"""How the shapes-world bases are pretrained (maintainers' tools; not shipped in the te-align package).

* :mod:`world_pretrain.recipe`: the configuration, the autoencoder, cached profile conditioning with the
  profile's dropout, each family's denoiser and loss, the training loop, the official pipeline around the
  parts, and held-out prompt evaluation.
* :mod:`world_pretrain.encoders`: the text encoders pretrained on world captions (shared by every family).
* :mod:`world_pretrain.diagnostics`: the conditioning gap and linear probes of the conditioning.
* :mod:`world_pretrain.build`: the command line (``python tools/world_build.py``).

Import with ``tools/`` on ``sys.path`` (``tools/world_build.py`` does this).
"""
