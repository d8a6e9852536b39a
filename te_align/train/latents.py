"""The VAE latent store of a training run: each image's latent distribution, encoded once and kept in memory and,
when ``data.cache_latents`` is on, on disk (verified by digest when read back). A FLUX.2 VAE's distributions are
handed out patchified and normalised by its BatchNorm statistics (``models.patchify_normalize``; stored as encoded)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from te_align import _safetensors
from te_align._paths import read_bytes
from te_align.encoding.cache.keys import hash_text_encoders, tensors_digest
from te_align.train._io import write_atomic
from te_align.train.config import TrainError
from te_align.train.data import Item, file_digest, load_pixels
from te_align.train.models import has_latent_batchnorm, latent_norm, patchify_normalize

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger("te_align.train")


class LatentStore:
    """VAE latent distributions (mean, std) per (image, flip), in memory and optionally on disk."""

    def __init__(self, vae: torch.nn.Module, directory: Path | None, device: torch.device, dtype: torch.dtype) -> None:
        self.vae = vae
        self.dir = directory
        self.device = device
        self.dtype = dtype
        self.mem: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}
        self.vae_hash = hash_text_encoders({"vae": vae}) if directory is not None else ""
        #: FLUX.2: the BatchNorm statistics the (mean, std) are normalised by when handed out (the store keeps them as
        #: encoded); read now, since the VAE may be freed once every latent is cached (te_align.train.residency)
        self.norm = latent_norm(vae) if has_latent_batchnorm(vae) else None

    def get(self, index: int, item: Item, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the image's latent distribution, in the layout the model's latents have."""
        mean, std = self._get(index, item, flip)
        if self.norm is None:
            return mean, std
        pm, ps = patchify_normalize(self.norm, mean, std)
        assert ps is not None
        return pm, ps

    def _encode(self, item: Item, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        px, _ = load_pixels(item, flip)
        with torch.no_grad():
            dist = self.vae.encode(px[None].to(self.device, self.dtype)).latent_dist
        return dist.mean[0].float().cpu(), dist.std[0].float().cpu()

    def _get(self, index: int, item: Item, flip: bool) -> tuple[torch.Tensor, torch.Tensor]:
        key = (index, flip)
        if key in self.mem:
            return self.mem[key]
        if self.dir is None:
            return self._encode(item, flip)
        import hashlib

        from safetensors.torch import load, save

        ident = f"{file_digest(item.path)}|{item.bucket}|{flip}|{self.vae_hash}|{self.dtype}"
        name = hashlib.sha256(ident.encode()).hexdigest()
        path = self.dir / name[:2] / f"{name}.safetensors"
        value = None
        if path.is_file():
            why = ""
            try:
                data = read_bytes(path, TrainError)
                meta = _safetensors.parse_header(data, len(data), label=str(path), error=TrainError).metadata
                t = load(data)
                if meta.get("te_align.tensors_sha256") != tensors_digest({"mean": t["mean"], "std": t["std"]}):
                    why = "tensor bytes do not match their recorded digest" if "te_align.tensors_sha256" in meta else "no digest"
                else:
                    value = (t["mean"], t["std"])
            except Exception as e:  # a truncated or garbage entry is recomputed
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
            if value is None:
                logger.warning("latent cache: entry %s is damaged (%s); re-encoding it", path, why)
        if value is None:
            value = self._encode(item, flip)
            tensors = {"mean": value[0].contiguous(), "std": value[1].contiguous()}
            write_atomic(path, save(tensors, metadata={"te_align.tensors_sha256": tensors_digest(tensors)}))
        self.mem[key] = value
        return value


__all__ = ["LatentStore"]
