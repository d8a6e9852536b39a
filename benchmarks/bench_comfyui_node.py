"""The te-align Text Encode node against ComfyUI's stock CLIPTextEncode on the same encoders, side by side.

Speed target (issue 27): the node's encode time within 5% of CLIPTextEncode's on the same encoders, and no extra
resident copy of any encoder. Needs a ComfyUI checkout (TE_ALIGN_COMFYUI_DIR) and its import dependencies.

Setup: ComfyUI's SD1 text encoder at the real CLIP-L size (12 layers x 768, 123M parameters, random weights,
float32) and ComfyUI's tiny Flux encoders; profiles whose token lengths equal ComfyUI's for the prompts used
(sd15: 77; flux-schnell: T5 256), so both nodes do the same encoder work. Calls alternate stock / node, ROUNDS
times, one prompt each; medians and their ratio are printed. Memory: the process's peak RSS before and after the
node's calls, against the size of the encoder's weights.

    OMP_NUM_THREADS=1 TE_ALIGN_COMFYUI_DIR=/path/to/ComfyUI python benchmarks/bench_comfyui_node.py
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUNDS = int(os.environ.get("ROUNDS", "30"))
PROMPTS = ["a photo of a red cube on a wooden table, soft light", "a cat", "portrait of an old man, oil painting"]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _real_size_sd1(comfy_dir: str):
    import torch

    from te_align.integrations.comfyui import tiny

    tiny.import_comfyui(comfy_dir)
    from types import SimpleNamespace

    import comfy.sd
    import comfy.sd1_clip as sd1_clip

    clip = comfy.sd.CLIP(SimpleNamespace(params={}, clip=sd1_clip.SD1ClipModel, tokenizer=sd1_clip.SD1Tokenizer),
                         model_options={"dtype": torch.float32})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in clip.cond_stage_model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return clip


def _bench(label: str, clip, profile, prompts: list[str]) -> tuple[float, float]:
    import nodes
    import torch

    from te_align.integrations.comfyui.nodes import TeAlignTextEncode

    stock, ours = [], []
    node = TeAlignTextEncode()
    with torch.no_grad():
        for _ in range(2):  # warm-up: tokenizer copies, allocator
            nodes.CLIPTextEncode().encode(clip, prompts[0])
            node.encode(clip, profile, prompts[0])
        for i in range(ROUNDS):
            prompt = prompts[i % len(prompts)]
            t = time.perf_counter()
            nodes.CLIPTextEncode().encode(clip, prompt)
            stock.append(time.perf_counter() - t)
            t = time.perf_counter()
            node.encode(clip, profile, prompt)
            ours.append(time.perf_counter() - t)
    s, o = statistics.median(stock), statistics.median(ours)
    print(f"{label:<44} stock {s * 1000:8.2f} ms   te-align node {o * 1000:8.2f} ms   ratio {o / s:.3f}")
    return s, o


def main() -> int:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    comfy_dir = os.environ.get("TE_ALIGN_COMFYUI_DIR")
    if not comfy_dir:
        print("TE_ALIGN_COMFYUI_DIR (a ComfyUI checkout) is not set")
        return 2
    import te_align
    from te_align.integrations.comfyui import tiny

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {ROUNDS} rounds, medians")
    clip = _real_size_sd1(comfy_dir)
    weights = sum(p.numel() * p.element_size() for p in clip.cond_stage_model.parameters()) / 2**20
    p = te_align.profile("sd15")
    import nodes

    nodes.CLIPTextEncode().encode(clip, PROMPTS[0])
    before = _rss_mib()
    _bench("sd15, CLIP-L real size (123M, fp32)", clip, p, PROMPTS)
    after = _rss_mib()
    print(f"peak RSS {before:.0f} MiB before the node's first call, {after:.0f} MiB after "
          f"(+{after - before:.0f} MiB); the encoder's weights are {weights:.0f} MiB")
    tc = tiny.build("flux", comfy_dir)
    _bench("flux-schnell, tiny CLIP-L + T5 (256 tokens)", tc.clip, tiny.fitted_profile("flux-schnell", tc), PROMPTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
