"""Hook overhead on OneTrainer's encode path, side by side in one run.

Needs a Nerogar/OneTrainer checkout: ``TE_ALIGN_ONETRAINER_DIR=/path/to/OneTrainer python benchmarks/speed/bench_hooks_onetrainer.py``.

"Same work": SD1.5 (``StableDiffusionModel`` with a CLIP-L at its real size, 12 layers x 768, random
weights, real CLIP BPE), a batch of captions for which unpatched OneTrainer and the sd15 profile give
bit-identical tensors (checked before timing). Timed, interleaved, median of N rounds:

* ``unpatched``: OneTrainer's training-step call ``encode_text(tokens=...)`` on the batch's tokens;
* ``hooked``: the same call with te-align's OneTrainer hooks installed;
* ``te_align.encode``: te-align called directly on the same captions (tokenization included).

Printed: each median and hooked vs unpatched (the acceptance number, target <= 2%). A 12-layer CLIP
call varies by a few percent from call to call on a shared CPU, more than the hook adds, so the added
work is also measured on its own: the same call on a one-layer encoder of CLIP-L's width (every
tensor the hook touches has its real size), hooked and unpatched in adjacent pairs, many pairs; the
median per-pair difference is the hook's cost, printed as a share of the 12-layer unpatched call.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(rounds: int = 11, batch: int = 4, pairs: int = 300) -> None:
    ot_dir = os.environ.get("TE_ALIGN_ONETRAINER_DIR")
    if not ot_dir:
        raise SystemExit("set TE_ALIGN_ONETRAINER_DIR to a Nerogar/OneTrainer checkout")
    import torch
    import transformers

    import te_align
    from te_align.tiny.tokenizers import clip_tokenizer
    from te_align.trainers.onetrainer import hooks as hooks
    from te_align.trainers.onetrainer.probe import OneTrainer, clip_text_model_view

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1)))
    tok = clip_tokenizer(pad="<|endoftext|>")
    profile = te_align.profile("sd15")

    def clip_l(layers: int) -> transformers.CLIPTextModel:
        torch.manual_seed(0)
        te = transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=12,
            max_position_embeddings=77, projection_dim=768, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407,
        )).eval()  # fmt: skip
        clip_text_model_view(te)  # OneTrainer pins transformers 5.5.4, whose CLIPTextModel has .text_model
        return te

    adapter = OneTrainer(ot_dir)
    captions = [f"a photo of a cat number {i}, highly detailed, sharp focus, studio lighting" for i in range(batch)]
    cpu = torch.device("cpu")
    with adapter.session(), torch.no_grad():
        te = clip_l(12)
        model = adapter.model("sd15", {"tokenizer": tok}, {"text_encoder": te})
        ids = tok(captions, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids

        def unpatched(m=model) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return m.encode_text(train_device=cpu, batch_size=batch, tokens=ids)

        def direct() -> torch.Tensor:
            return te_align.encode(profile, captions, tokenizers={"tokenizer": tok}, text_encoders={"text_encoder": te})["prompt_embeds"]

        plain = unpatched()
        hooks.install(profile=profile, parts=("models",))
        hooked_out = unpatched()
        hooks.uninstall()
        assert torch.equal(plain, hooked_out) and torch.equal(plain, direct()), "not the same work: outputs differ"

        times: dict[str, list[float]] = {k: [] for k in ("unpatched", "hooked", "te_align.encode")}

        def timed(name: str, fn) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

        for _ in range(2):  # warm-up
            unpatched(), direct()
        for _ in range(rounds):
            timed("unpatched", unpatched)
            hooks.install(profile=profile, parts=("models",))
            timed("hooked", unpatched)
            hooks.uninstall()
            timed("te_align.encode", direct)
        # the added work alone: adjacent hooked/unpatched pairs on a one-layer CLIP-L-width encoder
        small = adapter.model("sd15", {"tokenizer": tok}, {"text_encoder": clip_l(1)})
        for _ in range(5):
            unpatched(small)
        added: list[float] = []
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)  # alternate which side goes first
            spent = {}
            for hooked in order:
                if hooked:
                    hooks.install(profile=profile, parts=("models",))
                t0 = time.perf_counter()
                unpatched(small)
                spent[hooked] = time.perf_counter() - t0
                if hooked:
                    hooks.uninstall()
            added.append(spent[True] - spent[False])
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"OneTrainer encode_text(tokens=...), SD1.5 CLIP-L 12x768, batch {batch}, {rounds} interleaved rounds (median ms):")
    for k, v in med.items():
        print(f"  {k:<18} {v:9.2f} ms")
    print(f"  hooked vs unpatched        {100 * (med['hooked'] / med['unpatched'] - 1):+6.2f} %   (target <= +2 %)")
    print(f"  hooked vs te_align.encode  {100 * (med['hooked'] / med['te_align.encode'] - 1):+6.2f} %")
    q = statistics.quantiles(added, n=4)
    d = statistics.median(added) * 1000
    print(f"added work alone ({pairs} adjacent pairs on a 1-layer CLIP-L-width encoder, hooked - unpatched): median "
          f"{d:+7.3f} ms (quartiles {q[0] * 1000:+.3f} .. {q[2] * 1000:+.3f} ms) = {100 * d / med['unpatched']:+6.2f} % "
          "of the 12-layer unpatched call   (target <= +2 %)")


if __name__ == "__main__":
    main()
