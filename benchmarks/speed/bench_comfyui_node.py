"""The te-align Text Encode node against ComfyUI's stock CLIPTextEncode on the same encoders, side by side.

Speed target (issue 27): the node's encode time within 5% of CLIPTextEncode's on the same encoders, and no extra
resident copy of any encoder. Needs a ComfyUI checkout (TE_ALIGN_COMFYUI_DIR) and its import dependencies.

Setup: ComfyUI's SD1 text encoder at the real CLIP-L size (12 layers x 768, 123M parameters, random weights,
float32) and ComfyUI's tiny Flux encoders; profiles whose token lengths equal ComfyUI's for the prompts used
(sd15: 77; flux-schnell: T5 256), so both nodes do the same encoder work. Both nodes run as ComfyUI's executor
runs them (under ``torch.inference_mode()``, execution.py), the te-align node with the profile given by name as
the UI gives it. Each round calls both once on the same prompt, in alternating order (stock first in even rounds,
the node first in odd ones), so neither always runs on warm caches after the other.

Printed per case: medians of wall time and of the thread's CPU time (``time.thread_time``: what the call itself
computed, less sensitive to other processes sharing the cores), the node/stock ratio of each, the spread of the
wall ratio over ``BLOCKS`` consecutive blocks of rounds, and the CPU time each node spends outside ComfyUI's encoder
modules (tokenizing and bookkeeping; forward hooks on the modules both nodes run). Memory: the process's peak RSS before and after the
node's calls, against the size of the encoder's weights.

    OMP_NUM_THREADS=1 TE_ALIGN_COMFYUI_DIR=/path/to/ComfyUI python benchmarks/speed/bench_comfyui_node.py
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROUNDS = int(os.environ.get("ROUNDS", "40"))
BLOCKS = int(os.environ.get("BLOCKS", "4"))
PROMPTS = ["a photo of a red cube on a wooden table, soft light", "a cat", "portrait of an old man, oil painting"]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _real_size_sd1(comfy_dir: str) -> Any:
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


class _InEncoders:
    """CPU time spent inside the encoder transformer modules (forward pre-/post-hooks on ComfyUI's modules, which
    both nodes run), so each call's work outside them -- tokenizing, bookkeeping -- can be told apart."""

    def __init__(self, clip: Any) -> None:
        self.total = 0.0
        self._start = 0.0
        for attr in ("clip_l", "clip_g", "t5xxl"):
            sub = getattr(clip.cond_stage_model, attr, None)
            if sub is not None:
                sub.transformer.register_forward_pre_hook(self._pre)
                sub.transformer.register_forward_hook(self._post)

    def _pre(self, *_: Any) -> None:
        self._start = time.thread_time()

    def _post(self, *_: Any) -> None:
        self.total += time.thread_time() - self._start


def _timed(f: Callable[[], Any], inside: _InEncoders) -> tuple[float, float, float]:
    before = inside.total
    w, c = time.perf_counter(), time.thread_time()
    f()
    w, c = time.perf_counter() - w, time.thread_time() - c
    return w, c, c - (inside.total - before)


def _bench(label: str, clip: Any, profile: Any, prompts: list[str]) -> float:
    import nodes
    import torch

    from te_align.integrations.comfyui.nodes import TeAlignTextEncode

    node = TeAlignTextEncode()
    inside = _InEncoders(clip)
    times: dict[str, tuple[list[float], list[float], list[float]]] = {"stock": ([], [], []), "node": ([], [], [])}
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        for _ in range(2):  # warm-up: tokenizer copies, allocator
            nodes.CLIPTextEncode().encode(clip, prompts[0])
            node.encode(clip, profile, prompts[0])
        for i in range(ROUNDS):
            prompt = prompts[i % len(prompts)]
            runs = [("stock", lambda prompt=prompt: nodes.CLIPTextEncode().encode(clip, prompt)),
                    ("node", lambda prompt=prompt: node.encode(clip, profile, prompt))]
            for name, f in runs if i % 2 == 0 else runs[::-1]:
                for series, value in zip(times[name], _timed(f, inside), strict=True):
                    series.append(value)
    med = statistics.median
    (stock_w, stock_c, stock_o), (ours_w, ours_c, ours_o) = times["stock"], times["node"]
    sw, ow, sc, oc = med(stock_w), med(ours_w), med(stock_c), med(ours_c)
    size = max(2, ROUNDS // BLOCKS)
    blocks = [med(ours_w[k:k + size]) / med(stock_w[k:k + size]) for k in range(0, ROUNDS - size + 1, size)]
    print(f"{label}\n  wall: stock {sw * 1000:8.2f} ms   te-align node {ow * 1000:8.2f} ms   ratio {ow / sw:.3f}"
          f"   (per block of {size} rounds: {min(blocks):.3f} to {max(blocks):.3f})\n"
          f"  cpu:  stock {sc * 1000:8.2f} ms   te-align node {oc * 1000:8.2f} ms   ratio {oc / sc:.3f}\n"
          f"  cpu outside the encoder modules: stock {med(stock_o) * 1000:.2f} ms, te-align node "
          f"{med(ours_o) * 1000:.2f} ms")
    return ow / sw


def main() -> int:
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    comfy_dir = os.environ.get("TE_ALIGN_COMFYUI_DIR")
    if not comfy_dir:
        print("TE_ALIGN_COMFYUI_DIR (a ComfyUI checkout) is not set")
        return 2
    from te_align.integrations.comfyui import tiny

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {ROUNDS} rounds, medians, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start")
    clip = _real_size_sd1(comfy_dir)
    weights = sum(p.numel() * p.element_size() for p in clip.cond_stage_model.parameters()) / 2**20
    import nodes

    with torch.inference_mode():
        nodes.CLIPTextEncode().encode(clip, PROMPTS[0])
    before = _rss_mib()
    _bench("sd15 (by name), CLIP-L real size (123M, fp32)", clip, "sd15", PROMPTS)
    after = _rss_mib()
    print(f"  peak RSS {before:.0f} MiB before the node's first call, {after:.0f} MiB after "
          f"(+{after - before:.0f} MiB); the encoder's weights are {weights:.0f} MiB")
    tc = tiny.build("flux", comfy_dir)
    _bench("flux-schnell, tiny CLIP-L + T5 (256 tokens)", tc.clip, tiny.fitted_profile("flux-schnell", tc), PROMPTS)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
