"""A disk cache of encoded captions, keyed by everything that decides the embeddings.

One caption's :class:`~te_align.encoding.conditioning.Conditioning` (batch of one) is one
``.safetensors`` file::

    DIR/.te-align-cache.json            marker (format name and version)
    DIR/ab/cd/abcd…(64 hex).safetensors one entry: the tensors + te_align.* metadata

- :mod:`~te_align.encoding.cache.keys`: the key recipe, the entry format and the hashes that go
  into keys (text-encoder weights, tokenizers, tensor digests).
- :mod:`~te_align.encoding.cache.store`: :class:`~te_align.encoding.cache.store.EmbeddingCache`,
  reading and writing entries.
- :mod:`~te_align.encoding.cache.admin`: :func:`~te_align.encoding.cache.admin.scan` and
  :func:`~te_align.encoding.cache.admin.clear` over a whole folder (``te-align cache info|clear``).

Importing any of them imports no torch; torch and safetensors.torch load when a function needs them.
"""
