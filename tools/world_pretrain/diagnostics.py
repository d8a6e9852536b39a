"""Diagnostics of world pretraining: how much a denoiser uses its prompts, and what its conditioning carries.

* :func:`conditioning_gap`: the relative rise of the denoiser's x0 error when every image gets another image's
  caption (moves long before prompt accuracy does).
* :func:`degrade`: noisy, blurred or JPEG-compressed renders, to measure the world's reader on images like
  generated samples (``benchmarks/world/bench_world.py``, ``tests/tiny/test_world.py``).
* :func:`probe_conditioning`: linear read-outs of a profile's conditioning (the pooled vector, the mean of
  the sequence, an attention-pooled sequence) trained on some captions and scored on others: can the
  object's colour, shape, position and size be read from what the denoiser is given?
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from te_align.tiny.world.reader import _blur
from world_pretrain.recipe import (
    EPS_FAMILIES,
    PACKED_FAMILIES,
    ConditioningTable,
    PretrainConfig,
    _ddpm_schedule,
    _denoise,
)

__all__ = ["conditioning_gap", "degrade", "probe_conditioning"]


def conditioning_gap(
    cfg: PretrainConfig,
    denoiser: Any,
    latents: Any,
    table: ConditioningTable,
    fractions: Sequence[float] = (0.3, 0.6, 0.9),
    seed: int = 0,
) -> dict[float, float]:
    """How much the denoiser uses its prompts: the relative rise of its x0 error when the captions are wrong.

    For each noise level ``f`` in ``fractions`` (flow ``t = f``; SDXL timestep ``round(999 f)``), the
    latents are noised with fixed noise (``seed``), and the clean latents predicted from the denoiser's
    output with each image's own conditioning (``table`` rows in latent order) and with the rows rolled by
    one (every image gets another image's caption). Returns ``{f: 100 (err_rolled - err_own) / err_own}``
    in percent. The error is measured on x0 so that every family and every noise level is on one scale
    (an epsilon loss hides what the text decides at high noise). A model that ignores its text has a gap
    of about 0; :func:`evaluate_pipeline`'s accuracy moves much later than this number.
    """
    import torch

    n = latents.shape[0]
    dev = next(denoiser.parameters()).device
    latents = latents.to(dev)
    own = {k: v.to(dev) for k, v in table.rows(torch.arange(n)).items()}
    rolled = {k: v.to(dev) for k, v in table.rows(torch.roll(torch.arange(n), 1)).items()}
    shared = {k: v.to(dev) for k, v in table.shared.items()}
    gen = torch.Generator().manual_seed(seed)
    was_training = denoiser.training
    denoiser.eval()
    out: dict[float, float] = {}
    with torch.no_grad():
        for frac in fractions:
            noise = torch.randn(latents.shape, generator=gen).to(dev)
            errs = []
            for rows in (own, rolled):
                errs.append(
                    float(
                        (
                            (_predict_x0(cfg, denoiser, latents, noise, frac, rows, shared) - latents)
                            ** 2
                        ).mean()
                    )
                )
            out[float(frac)] = 100.0 * (errs[1] - errs[0]) / errs[0]
    denoiser.train(was_training)
    return out


def _predict_x0(
    cfg: PretrainConfig,
    model: Any,
    x0: Any,
    noise: Any,
    frac: float,
    rows: dict[str, Any],
    shared: dict[str, Any],
) -> Any:
    """The clean latents ``cfg.family``'s denoiser predicts at noise level ``frac`` (see :func:`training_loss`)."""
    import torch

    n = x0.shape[0]
    if cfg.family in EPS_FAMILIES:
        sched = _ddpm_schedule()
        timesteps = torch.full((n,), round(frac * (sched.config.num_train_timesteps - 1)), dtype=torch.long)
        xt = sched.add_noise(x0, noise, timesteps)
        eps = _denoise(cfg, model, xt, timesteps, rows, shared)
        abar = sched.alphas_cumprod[timesteps].to(x0.dtype).view(-1, 1, 1, 1)
        return (xt - (1 - abar).sqrt() * eps) / abar.sqrt()
    xt = (1 - frac) * x0 + frac * noise
    v = _denoise(cfg, model, xt, torch.full((n,), float(frac)), rows, shared)
    if cfg.family in PACKED_FAMILIES:  # flux, chroma: ChromaPipeline's packing is copied from Flux's
        import diffusers

        h, w = x0.shape[-2:]
        v = diffusers.FluxPipeline._unpack_latents(v, h * 8, w * 8, 8)  # vae_scale_factor 8: h * 8 // 8 latent rows
    elif cfg.family == "klein":  # tokens back to the patchified latents by their ids, as Flux2KleinPipeline does
        import diffusers

        klein = diffusers.Flux2KleinPipeline
        h, w = x0.shape[-2:]
        v = klein._unpack_latents_with_ids(v, klein._prepare_latent_ids(x0).to(x0.device), h, w)
    # x_t = (1 - t) x0 + t e and v = e - x0  =>  x0 = x_t - t v
    return xt - frac * v




# --------------------------------------------------------------------------------------------------
# linear probes of the conditioning
# --------------------------------------------------------------------------------------------------

PROBE_ATTRIBUTES = ("colour", "shape", "position", "size")


def _fit_probe(x_train: Any, y_train: Any, x_test: Any, y_test: Any, classes: int, *, attention: bool,
               steps: int = 300, seed: int = 0) -> float:  # fmt: skip
    """Test accuracy of a softmax read-out (``attention``: a learned query pools the sequence first)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mu = x_train.mean(dim=tuple(range(x_train.dim() - 1)), keepdim=True)
        sd = x_train.std(dim=tuple(range(x_train.dim() - 1)), keepdim=True) + 1e-6
        xa, xb = (x_train - mu) / sd, (x_test - mu) / sd
        d = xa.shape[-1]
        lin = torch.nn.Linear(d, classes)
        params = list(lin.parameters())
        if attention:
            query = torch.nn.Linear(d, 1)
            params += list(query.parameters())
        opt = torch.optim.Adam(params, lr=1e-2, weight_decay=1e-4)

        def head(x: Any) -> Any:
            if attention:
                w = torch.softmax(query(x).squeeze(-1), dim=1)
                x = (w.unsqueeze(-1) * x).sum(1)
            return lin(x)

        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(head(xa), y_train)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            return float((head(xb).argmax(1) == y_test).float().mean())


def probe_conditioning(
    table: ConditioningTable, samples: Sequence[Any], n_train: int, *, steps: int = 300
) -> dict[str, dict[str, float]]:
    """Read each single-object sample's colour, shape, position and size from its conditioning.

    The first ``n_train`` rows of ``table`` / ``samples`` train the read-outs, the rest test them. Read-outs:
    ``pooled`` (linear on ``pooled_prompt_embeds`` where the profile has one), ``mean`` (linear on the mean over
    the sequence, padding included, as the denoiser sees it) and ``attention`` (a learned query softmax-pools
    the sequence, then linear: the mechanism a denoiser's attention has). Returns accuracies per read-out and
    attribute.
    """
    import torch

    from te_align.tiny import world

    values = {"colour": list(world.COLOURS), "shape": list(world.SHAPES), "position": list(world.POSITIONS),
              "size": list(world.SIZES)}  # fmt: skip
    keep = [i for i, s in enumerate(samples) if len(s.objects) == 1]
    keepset = set(keep)
    train = torch.tensor([i for i in keep if i < n_train])
    test = torch.tensor([i for i in keep if i >= n_train])
    seq = table.tensors["prompt_embeds"].float()
    feats = {"mean": (seq.mean(1), False), "attention": (seq, True)}
    if "pooled_prompt_embeds" in table.tensors:
        feats = {"pooled": (table.tensors["pooled_prompt_embeds"].float(), False), **feats}
    out: dict[str, dict[str, float]] = {}
    for name, (x, attention) in feats.items():
        out[name] = {}
        for attr in PROBE_ATTRIBUTES:
            y = torch.tensor([values[attr].index(samples[i].objects[0].get(attr)) if i in keepset else 0
                              for i in range(len(samples))])  # fmt: skip
            out[name][attr] = _fit_probe(x[train], y[train], x[test], y[test], len(values[attr]), attention=attention,
                                         steps=steps)  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------
# degraded renders
# --------------------------------------------------------------------------------------------------


def degrade(
    img: np.ndarray, *, noise: float = 0.0, blur: float = 0.0, jpeg: int | None = None, seed: int = 0
) -> np.ndarray:
    """``img`` degraded like a generated sample: Gaussian blur (``blur``: sigma in pixels), additive
    Gaussian noise (``noise``: sigma on 0-255, from ``seed``) and JPEG quantisation (``jpeg``: Pillow
    quality, 4:2:0 chroma subsampling), in that order. Deterministic."""
    x = np.asarray(img)[:, :, :3].astype(np.float64)
    if blur > 0:
        x = np.stack([_blur(x[:, :, c], blur) for c in range(3)], axis=2)
    if noise > 0:
        x = x + np.random.default_rng(seed).normal(0.0, noise, size=x.shape)
    out = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if jpeg is not None:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(out).save(buf, format="JPEG", quality=int(jpeg))
        buf.seek(0)
        out = np.asarray(Image.open(buf).convert("RGB"))
    return out
