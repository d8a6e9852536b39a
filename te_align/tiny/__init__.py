"""te-align's offline tiny world: real-convention tokenizers, tiny random-weight models, synthetic data.

Product code, not test scaffolding: ``te-align probe`` runs a trainer's real encoding code on these
models, ``te-align demo`` trains and evaluates on them, and the test suite imports them directly. Nothing
here touches the network; every model is built from a fixed seed (two builds give bit-identical weights)
and every dataset is drawn from a seed.

Modules (import the one you need; importing this package imports no torch):

* :mod:`te_align.tiny.tokenizers`: CLIP BPE rebuilt exactly from open_clip's ``bpe_simple_vocab_16e6.txt.gz``,
  and small-vocabulary T5 / UMT5 / pile-T5 / Gemma / Llama-3 / Qwen tokenizers with the real special
  tokens and conventions, loaded through the real ``transformers`` classes from a cache folder.
* :mod:`te_align.tiny.encoders`: tiny text encoders (CLIP, T5, UMT5, ByT5, Gemma2, Llama, Qwen2.5-VL, Qwen3)
  and ``family_components(family)``: a family's tokenizers and encoders under the diffusers component names.
* :mod:`te_align.tiny.pipelines`: the real diffusers pipelines around them: for ``encode_prompt`` only
  (``build_pipeline_for_encoding``), complete trainable ones with tiny UNets / transformers / VAEs
  (``build_pipeline``, ``build_model_folder``), and the tiny-demo preset's SD3-shaped model (``build_tiny_sd3``).
* :mod:`te_align.tiny.fit`: fitting a bundled profile's architecture numbers (hidden sizes, layer counts,
  token ids) to the tiny encoders, leaving every behaviour field as bundled.
* :mod:`te_align.tiny.datasets`: synthetic captioned images (the demo's coloured shapes, coloured squares).
* :mod:`te_align.tiny.world`: the shapes world (scenes, captions, reader, grid): procedural images of coloured
  shapes with captions in the styles trainers use (tags, short sentences, long natural language), held-out
  concepts, and a deterministic prompt-accuracy reader; ``world.base(name)`` loads a shipped base.
* :mod:`te_align.tiny.bases`: the pretrained world bases shipped in the ``te_align_world`` package (``world/`` in a clone) (float16, SHA-256 checked on
  every load), materialized as diffusers folders and loaded as their official pipelines. How they were pretrained
  is in ``tools/world_pretrain/`` (not shipped).
* :mod:`te_align.tiny.klein`: the parts of a FLUX.2 klein-shaped world base (a 31-layer Qwen3 text encoder, a tiny
  Flux2Transformer2DModel on its three stacked taps, the shared autoencoder as an AutoencoderKLFlux2) and the
  official Flux2KleinPipeline around them; planned in ``benchmarks/klein/bench_klein.md``, not pretrained yet.
"""
