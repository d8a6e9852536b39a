"""Hook overhead on sd-scripts' text path, side by side in one run.

Needs a kohya-ss/sd-scripts checkout: ``TE_ALIGN_KOHYA_DIR=/path/to/sd-scripts python benchmarks/speed/bench_kohya_hooks.py``.

"Same work": SD1.5 (CLIP-L at its real size, 12 layers x 768, random weights, real CLIP BPE), a batch
of prompts without "!" for which unpatched sd-scripts and the sd15 profile produce bit-identical
tensors (checked before timing). Three ways to make those tensors are timed, interleaved, median of
N rounds:

* ``unpatched``: sd-scripts' ``SdTokenizeStrategy.tokenize`` + ``SdTextEncodingStrategy.encode_tokens``;
* ``hooked``: the same two calls with te-align's kohya hooks installed;
* ``te_align.encode``: te-align called directly on the same prompts.

Printed: each median, and hooked vs unpatched (the acceptance number, target <= 2%) and hooked vs
te_align.encode (the cost of sd-scripts' call layout on top of te-align). Encode-only timings (the
training step's part: tokenization runs in DataLoader workers) are printed as well.

A 12-layer CLIP-L call takes tens to hundreds of milliseconds and varies by a few percent from call
to call on a shared CPU, more than the hook adds. So the added work is also measured on its own:
the same calls on a one-layer encoder of CLIP-L's width (every tensor the hook touches has its real
size; only the transformer stack is shorter), hooked and unpatched in adjacent pairs, many pairs;
the median per-pair difference in milliseconds is the hook's cost, printed as a share of the
12-layer unpatched call.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(rounds: int = 11, batch: int = 4, pairs: int = 400) -> None:
    kohya_dir = os.environ.get("TE_ALIGN_KOHYA_DIR")
    if not kohya_dir:
        raise SystemExit("set TE_ALIGN_KOHYA_DIR to a kohya-ss/sd-scripts checkout")
    import tempfile

    import torch
    import transformers

    import te_align
    from te_align.tiny.tokenizers import clip_tokenizer
    from te_align.trainers.kohya import hooks as hk
    from tests.trainers.kohya.test_kohya_integration import import_sd_scripts

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    sd = import_sd_scripts(str(Path(kohya_dir).resolve()))["strategy_sd"]
    cache = tempfile.mkdtemp(prefix="kohya_tok_")
    clip_tokenizer(pad="<|endoftext|>").save_pretrained(Path(cache) / "openai_clip-vit-large-patch14")
    tok = sd.SdTokenizeStrategy(False, None, cache)
    enc = sd.SdTextEncodingStrategy(None)
    torch.manual_seed(0)
    def clip_l(layers: int) -> transformers.CLIPTextModel:
        return transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=12,
            max_position_embeddings=77, projection_dim=768, bos_token_id=0, eos_token_id=2, pad_token_id=1,
        )).eval()  # fmt: skip

    te = clip_l(12)
    profile = te_align.profile("sd15")
    prompts = [f"a photo of a cat number {i}, highly detailed, sharp focus, studio lighting" for i in range(batch)]
    refs = {"tokenizer": tok.tokenizer}
    encs = {"text_encoder": te}

    def unpatched() -> torch.Tensor:
        return enc.encode_tokens(tok, [te], tok.tokenize(prompts))[0]

    def direct() -> torch.Tensor:
        return te_align.encode(profile, prompts, tokenizers=refs, text_encoders=encs)["prompt_embeds"]

    with torch.no_grad():
        plain = unpatched()
        hk.install(profile=profile)
        hooked_out = unpatched()
        assert torch.equal(plain, hooked_out) and torch.equal(plain, direct()), "not the same work: outputs differ"
        hk.uninstall()
        ids = tok.tokenize(prompts)

        times: dict[str, list[float]] = {k: [] for k in ("unpatched", "hooked", "te_align.encode", "encode-only unpatched", "encode-only hooked")}

        def timed(name: str, fn) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

        for _ in range(2):  # warm-up
            unpatched(), direct()
        for _ in range(rounds):
            timed("unpatched", unpatched)
            timed("encode-only unpatched", lambda: enc.encode_tokens(tok, [te], ids))
            hk.install(profile=profile)
            hk.profile_for("sd", tok)  # the profile is resolved once per run, not per call
            timed("hooked", unpatched)
            timed("encode-only hooked", lambda: enc.encode_tokens(tok, [te], ids))
            hk.uninstall()
            timed("te_align.encode", direct)
        # the added work alone: adjacent hooked/unpatched pairs on a one-layer CLIP-L-width encoder
        te1 = clip_l(1)
        added: dict[str, list[float]] = {"full path": [], "encode only": []}
        calls = {
            "full path": lambda: enc.encode_tokens(tok, [te1], tok.tokenize(prompts)),
            "encode only": lambda: enc.encode_tokens(tok, [te1], ids),
        }
        for _ in range(5):
            for fn in calls.values():
                fn()
        for i in range(pairs):
            for name, fn in calls.items():
                order = (False, True) if i % 2 == 0 else (True, False)  # alternate which side goes first
                spent = {}
                for hooked in order:
                    if hooked:
                        hk.install(profile=profile)
                        hk.profile_for("sd", tok)
                    t0 = time.perf_counter()
                    fn()
                    spent[hooked] = time.perf_counter() - t0
                    if hooked:
                        hk.uninstall()
                added[name].append(spent[True] - spent[False])
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"sd-scripts text path, SD1.5 CLIP-L 12x768, batch {batch}, {rounds} interleaved rounds (median ms):")
    for k, v in med.items():
        print(f"  {k:<24} {v:9.2f} ms")
    print(f"  hooked vs unpatched        {100 * (med['hooked'] / med['unpatched'] - 1):+6.2f} %   (target <= +2 %)")
    print(f"  hooked vs te_align.encode  {100 * (med['hooked'] / med['te_align.encode'] - 1):+6.2f} %")
    print(f"  encode-only hooked vs unpatched {100 * (med['encode-only hooked'] / med['encode-only unpatched'] - 1):+6.2f} %")
    print(f"added work alone ({pairs} adjacent pairs on a 1-layer CLIP-L-width encoder, hooked - unpatched):")
    for name, diffs in added.items():
        q = statistics.quantiles(diffs, n=4)
        base = med["unpatched" if name == "full path" else "encode-only unpatched"]
        d = statistics.median(diffs) * 1000
        print(f"  {name:<12} median {d:+7.3f} ms (quartiles {q[0] * 1000:+.3f} .. {q[2] * 1000:+.3f} ms) = "
              f"{100 * d / base:+6.2f} % of the 12-layer unpatched call   (target <= +2 %)")

if __name__ == "__main__":
    main()
