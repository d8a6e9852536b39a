"""Hook overhead on SimpleTuner's encode path, side by side in one run.

Needs a bghira/SimpleTuner checkout: ``TE_ALIGN_SIMPLETUNER_DIR=/path/to/SimpleTuner python
benchmarks/speed/bench_hooks_simpletuner.py`` (its import-only dependencies that are missing here are stood in for,
as ``te-align probe`` does).

"Same work": SD 1.5 (CLIP-L at its real size, 12 layers x 768, random weights, real CLIP BPE), SimpleTuner's own
``StableDiffusion1._encode_prompts`` (its pipeline's ``encode_prompt``), a batch of prompts for which unpatched
SimpleTuner and the sd15 profile give bit-identical tensors (checked before timing). Timed, interleaved, median of
N rounds: ``unpatched`` (SimpleTuner as it is), ``hooked`` (te-align's SimpleTuner hook installed) and
``te_align.encode`` (te-align called directly). Printed: each median and the ratio hooked / unpatched (target
<= +2 %).

A 12-layer call varies by a few percent from call to call on a shared CPU, more than the hook adds, so the added
work is also measured on its own: the same calls on a one-layer encoder of CLIP-L's width, hooked and unpatched in
adjacent pairs (alternating which goes first), the median per-pair difference as a share of the 12-layer call.
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
    st_dir = os.environ.get("TE_ALIGN_SIMPLETUNER_DIR")
    if not st_dir:
        raise SystemExit("set TE_ALIGN_SIMPLETUNER_DIR to a bghira/SimpleTuner checkout")
    import torch
    import transformers

    import te_align
    from te_align.probe.adapter import _tiny
    from te_align.probe.core import quiet
    from te_align.trainers.simpletuner.hooks import SimpleTunerHook
    from te_align.trainers.simpletuner.probe import SimpleTunerProbe

    def clip_l(layers: int) -> transformers.CLIPTextModel:
        torch.manual_seed(0)
        return transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=layers, num_attention_heads=12,
            max_position_embeddings=77, projection_dim=768, bos_token_id=0, eos_token_id=2, pad_token_id=1,
        )).eval()  # fmt: skip

    adapter = SimpleTunerProbe(st_dir)
    prompts = [f"a photo of a cat number {i}, highly detailed, sharp focus, studio lighting" for i in range(batch)]
    with quiet(), adapter.session(), torch.no_grad():
        torch.set_num_threads(1)
        models = {}
        for layers in (12, 1):
            prof, toks, encs, pipe = _tiny("sd15", text_encoder=clip_l(layers))
            models[layers] = (adapter.model("sd15", toks, encs, pipe), prof, toks, encs)
        model, profile, toks, encs = models[12]
        hook = SimpleTunerHook(profile=profile, families=("sd1x",), cache=False)

        def unpatched() -> torch.Tensor:
            return model._encode_prompts(prompts)

        def direct() -> torch.Tensor:
            return te_align.encode(profile, prompts, tokenizers=toks, text_encoders=encs)["prompt_embeds"]

        plain = unpatched()
        hook.install()
        hooked_out = unpatched()
        hook.uninstall()
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
            hook.install()
            timed("hooked", unpatched)
            hook.uninstall()
            timed("te_align.encode", direct)
        small = models[1][0]
        added: list[float] = []
        for _ in range(5):
            small._encode_prompts(prompts)
        for i in range(pairs):
            spent = {}
            for hooked in ((False, True) if i % 2 == 0 else (True, False)):
                if hooked:
                    hook.install()
                t0 = time.perf_counter()
                small._encode_prompts(prompts)
                spent[hooked] = time.perf_counter() - t0
                if hooked:
                    hook.uninstall()
            added.append(spent[True] - spent[False])
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"SimpleTuner text path (StableDiffusion1._encode_prompts), SD1.5 CLIP-L 12x768, batch {batch}, "
          f"{rounds} interleaved rounds, 1 thread (median ms):")
    for k, v in med.items():
        print(f"  {k:<18} {v:9.2f} ms")
    print(f"  ratio hooked / unpatched   {med['hooked'] / med['unpatched']:.4f}  "
          f"({100 * (med['hooked'] / med['unpatched'] - 1):+.2f} %, target <= +2 %)")
    print(f"  ratio hooked / te_align.encode {med['hooked'] / med['te_align.encode']:.4f}")
    q = statistics.quantiles(added, n=4)
    d = statistics.median(added) * 1000
    print(f"added work alone ({pairs} adjacent pairs on a 1-layer CLIP-L-width encoder, hooked - unpatched): "
          f"median {d:+.3f} ms (quartiles {q[0] * 1000:+.3f} .. {q[2] * 1000:+.3f} ms) = "
          f"{100 * d / med['unpatched']:+.2f} % of the 12-layer unpatched call (target <= +2 %)")


if __name__ == "__main__":
    main()
