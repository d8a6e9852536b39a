"""Step times of the klein-shaped world base (issue 49), one thread, before its plan (benchmarks/klein/bench_klein.md).

    python benchmarks/klein/bench_klein_steps.py [--repeat 5] [--out benchmarks/klein/steps.json]

Nothing is trained to use: every timed step starts from the tiny parts' random weights (te_align.tiny.klein), and the
data are world captions (te_align.tiny.world, the shared encoders' mix: half full world, half simple). Measured, each
as the median of ``--repeat`` steps after one warm-up step, with ``torch.set_num_threads(1)``:

* facts the design rests on: the tiny Qwen3's ``hidden_states`` has 32 entries, the last equals ``last_hidden_state``
  (after the final norm), taps 9/18/27 and 10/20/30 are different tensors; the templated caption lengths in tokens;
* **encoder step**: the 31-layer Qwen3ForCausalLM (width 32), batch 32 chat-templated captions (thinking off), padded
  to the batch's longest and to 512 (the profile's window: the pad states the denoiser reads); loss = next-token cross-entropy on the real tokens (every layer trained, as a causal LM) +
  four linear attribute heads (colour, shape, position, size) on the stacked taps 9/18/27 (96 wide) at every token;
  backward, AdamW. (The heads' exact targets are the plan's; their cost does not depend on which tokens are scored.)
* **denoiser step**: the tiny Flux2Transformer2DModel, batch 16, cached conditioning (B, T, 96) for T = 512 (the
  profile's window: klein pads to it and masks nothing in the transformer) and T = 256, 64 image tokens of 32 channels
  (32 px, the shared autoencoder's 8 latent channels patchified 2 x 2), rectified flow, backward, AdamW, EMA update;
* **LoRA step**: rank 8 on the diffusers klein script's default targets (``to_k``, ``to_q``, ``to_v``, ``to_out.0``,
  ``to_qkv_mlp_proj``, each single block's ``attn.to_out``; diffusers@58eb52c
  examples/dreambooth/train_dreambooth_lora_flux2_klein.py:1300-1303), batch 8, T = 512;
* **sampling**: one ``Flux2KleinPipeline`` call, 32 px, 16 steps, true CFG 4 against the encoded empty prompt
  (``is_distilled=False``), T = 512 — what one probe prompt costs at one checkpoint;
* **encoding**: 64 captions through ``te_align.encode`` with the fitted profile (an arm's training conditioning);
* **Z-Image-shaped alternative**: a tiny ZImageTransformer2DModel of the same width (64, 2 heads of 32), 4 main + 1 + 1
  refiner layers, reading ``hidden_states[-2]`` (width 32) of only each caption's real tokens (Z-Image's recipe: the
  pipeline keeps real tokens), batch 16 at the batches' measured lengths; its encoder step is the klein one's at the
  depth Z-Image needs (no tap constraint: 4 layers).

The unit estimate is the effects study's unit (bench_effects.md: one seed, LoRA rank 8, batch 8, 300 steps, 24 probe
prompts sampled at 4 checkpoints): two arms trained (a deviation row) = 2 x (encode 64 + 300 LoRA steps + 96
samples); one LoRA trained and sampled twice (an inference-side row, a positive control on sampling) = encode 64 +
300 LoRA steps + 2 x 96 samples.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

torch.set_num_threads(1)

import te_align  # noqa: E402
from te_align.tiny import klein, world  # noqa: E402
from te_align.tiny import tokenizers as tok  # noqa: E402

LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0", "to_qkv_mlp_proj"]


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def templated(tokenizer: Any, captions: list[str], thinking: bool = False) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                          add_generation_prompt=True, enable_thinking=thinking) for c in captions]


def captions(n: int) -> list[str]:
    half = n // 2
    full = world.make_dataset(half, 0, image_size=None, tokenizer=False)
    simple = world.make_dataset(n - half, 0, space=world.SIMPLE, image_size=None, tokenizer=False)
    return [s.caption for s in full + simple]


def encoder_step(
    encoder: Any, tokenizer: Any, texts: list[str], taps: tuple[int, ...], pad_to: int = 0
) -> Callable[[], float]:
    width = encoder.config.hidden_size
    heads = torch.nn.ModuleList([torch.nn.Linear(len(taps) * width, k) for k in (8, 4, 9, 3)])
    params = list(encoder.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    batch = (tokenizer(texts, padding="max_length", max_length=pad_to, truncation=True, return_tensors="pt") if pad_to
             else tokenizer(texts, padding="longest", return_tensors="pt"))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    targets = [torch.randint(0, h.out_features, batch["input_ids"].shape, generator=gen) for h in heads]
    encoder.train()

    def step() -> float:
        out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True,
                      use_cache=False)
        logits = out.logits[:, :-1]
        labels = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        stacked = torch.cat([out.hidden_states[k] for k in taps], dim=-1)
        for h, y in zip(heads, targets, strict=True):
            loss = loss + torch.nn.functional.cross_entropy(h(stacked).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss.detach())

    return step


def flux2_step(model: Any, batch: int, text_len: int, lora: bool = False) -> Callable[[], float]:
    from diffusers import Flux2KleinPipeline

    gen = torch.Generator().manual_seed(0)
    text = torch.randn(batch, text_len, model.config.joint_attention_dim, generator=gen)
    lat = torch.randn(batch, model.config.in_channels, 8, 8, generator=gen)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(lat)
    txt_ids = Flux2KleinPipeline._prepare_text_ids(text)
    x0 = Flux2KleinPipeline._pack_latents(lat)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    ema = None if lora else [p.detach().clone() for p in params]
    model.train()

    def step() -> float:
        t = torch.sigmoid(torch.randn(batch, generator=gen))
        noise = torch.randn(x0.shape, generator=gen)
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
        pred = model(hidden_states=xt, encoder_hidden_states=text, timestep=t, img_ids=img_ids, txt_ids=txt_ids,
                     guidance=None, return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(pred, noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                for e, p in zip(ema, params, strict=True):
                    e.lerp_(p, 0.001)
        return float(loss.detach())

    return step


def zimage_step(lengths: list[int]) -> Callable[[], float]:
    import diffusers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = diffusers.ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=8, dim=64, n_layers=4, n_refiner_layers=1,
            n_heads=2, n_kv_heads=2, cap_feat_dim=32, axes_dims=[8, 12, 12], axes_lens=[1024, 512, 512],
        )
    gen = torch.Generator().manual_seed(0)
    caps = [torch.randn(n, 32, generator=gen) for n in lengths]
    x0 = [torch.randn(8, 1, 16, 16, generator=gen) for _ in lengths]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    ema = [p.detach().clone() for p in model.parameters()]
    model.train()

    def step() -> float:
        t = torch.sigmoid(torch.randn(len(lengths), generator=gen))
        noise = [torch.randn(x.shape, generator=gen) for x in x0]
        xt = [(1 - ti) * x + ti * n for ti, x, n in zip(t, x0, noise, strict=True)]
        out = model(xt, 1 - t, caps, return_dict=False)[0]
        loss = sum(torch.nn.functional.mse_loss(o, n - x) for o, n, x in zip(out, noise, x0, strict=True)) / len(out)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, model.parameters(), strict=True):
                e.lerp_(p, 0.001)
        return float(loss.detach())

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/klein/steps.json")
    args = ap.parse_args()
    r: dict[str, Any] = {"threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg(),
                         "torch": torch.__version__, "repeat": args.repeat, "seconds": "CPU seconds (process_time)"}
    tokenizer = tok.qwen3_instruct_tokenizer()
    pipe = klein.build_klein_pipeline(tokenizer=tokenizer)
    enc = pipe.text_encoder

    # facts the design rests on
    ids = tokenizer(templated(tokenizer, ["a red square at the top left"]), return_tensors="pt")
    with torch.no_grad():
        out = enc.model(**ids, output_hidden_states=True)
    hs = out.hidden_states
    r["hidden_states"] = len(hs)
    r["last_hidden_state_is_final_normed"] = bool(torch.equal(hs[-1], out.last_hidden_state))
    r["taps_distinct"] = all(not torch.equal(hs[a], hs[b]) for a, b in ((9, 10), (18, 20), (27, 30)))
    caps = captions(2000)
    lens = sorted(len(x) for x in tokenizer(templated(tokenizer, caps))["input_ids"])
    r["templated_tokens"] = {"median": lens[len(lens) // 2], "p90": lens[int(0.9 * len(lens))],
                             "p99": lens[int(0.99 * len(lens))], "max": lens[-1],
                             "over_256": sum(n > 256 for n in lens) / len(lens),
                             "over_512": sum(n > 512 for n in lens) / len(lens)}  # fmt: skip
    print("facts:", json.dumps({k: r[k] for k in ("hidden_states", "last_hidden_state_is_final_normed",
                                                   "taps_distinct", "templated_tokens")}))  # fmt: skip

    # encoder pretraining step (31 layers) and the Z-Image alternative's (4 layers)
    batch_caps = templated(tokenizer, caps[:16] + caps[1000:1016])
    r["encoder_step_b32_s"] = timed(encoder_step(klein.klein_text_encoder(tokenizer), tokenizer, batch_caps, (9, 18, 27)), args.repeat)
    r["encoder_step_b32_4layers_s"] = timed(encoder_step(klein.klein_text_encoder(tokenizer, num_hidden_layers=4),
                                                         tokenizer, batch_caps, (1, 2, 3)), args.repeat)  # fmt: skip
    r["encoder_step_b32_longest"] = max(len(x) for x in tokenizer(batch_caps)["input_ids"])
    r["encoder_step_b32_t512_s"] = timed(encoder_step(klein.klein_text_encoder(tokenizer), tokenizer, batch_caps, (9, 18, 27),
                                                      pad_to=512), args.repeat)  # fmt: skip
    print(f"encoder step, batch 32 padded to its longest ({r['encoder_step_b32_longest']}): "
          f"{r['encoder_step_b32_s']:.3f} s (31 layers), {r['encoder_step_b32_4layers_s']:.3f} s (4 layers); "
          f"padded to 512: {r['encoder_step_b32_t512_s']:.3f} s (31 layers)")

    # denoiser pretraining steps
    for n in (512, 256):
        r[f"denoiser_step_b16_t{n}_s"] = timed(flux2_step(klein.klein_transformer(), 16, n), args.repeat)
        print(f"denoiser step, batch 16, text {n}: {r[f'denoiser_step_b16_t{n}_s']:.3f} s")
    r["denoiser_params"] = sum(p.numel() for p in pipe.transformer.parameters())

    # the Z-Image-shaped alternative: real-token lengths of 16-caption batches (the pipeline keeps real tokens only)
    z_lens = [len(x) for x in tokenizer(templated(tokenizer, caps[:8] + caps[1000:1008], thinking=True))["input_ids"]]
    r["zimage_batch_lengths"] = z_lens
    r["zimage_step_b16_s"] = timed(zimage_step(z_lens), args.repeat)
    print(f"Z-Image-shaped denoiser step, batch 16 at real lengths (max {max(z_lens)}): {r['zimage_step_b16_s']:.3f} s")

    # LoRA step (the effects unit's)
    from peft import LoraConfig

    lora_model = klein.klein_transformer()
    targets = LORA_TARGETS + [f"single_transformer_blocks.{i}.attn.to_out"
                              for i in range(lora_model.config.num_single_layers)]  # fmt: skip
    lora_model.requires_grad_(False)
    lora_model.add_adapter(LoraConfig(r=8, lora_alpha=8, init_lora_weights="gaussian", target_modules=targets))
    r["lora_step_b8_t512_s"] = timed(flux2_step(lora_model, 8, 512, lora=True), args.repeat)
    print(f"LoRA step, batch 8, text 512: {r['lora_step_b8_t512_s']:.3f} s")

    # sampling one probe prompt; encoding an arm's 64 captions
    probe = "top left: a pink triangle"
    r["sample_16steps_cfg4_s"] = timed(lambda: pipe(prompt=probe, height=32, width=32, num_inference_steps=16,
                                                     guidance_scale=4.0, generator=torch.Generator().manual_seed(0)),
                                       args.repeat)  # fmt: skip
    print(f"one probe sample (16 steps, CFG 4, text 512): {r['sample_16steps_cfg4_s']:.3f} s")
    profile = klein.klein_profile(pipe)
    r["encode_64_s"] = timed(lambda: te_align.encode(profile, caps[:64], pipeline=pipe), 1)
    print(f"encoding 64 captions: {r['encode_64_s']:.3f} s")

    train = 300 * r["lora_step_b8_t512_s"]
    samples = 4 * 24 * r["sample_16steps_cfg4_s"]
    r["unit_two_arms_s"] = 2 * (r["encode_64_s"] + train + samples)
    r["unit_one_lora_two_samplings_s"] = r["encode_64_s"] + train + 2 * samples
    print(f"unit estimate: {r['unit_two_arms_s']:.0f} s (two arms trained), "
          f"{r['unit_one_lora_two_samplings_s']:.0f} s (one LoRA, sampled two ways)")
    r["load_average_at_end"] = os.getloadavg()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
