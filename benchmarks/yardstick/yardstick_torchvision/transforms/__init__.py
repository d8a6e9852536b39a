"""``torchvision.transforms`` stand-in: Compose, Resize, CenterCrop, RandomCrop, RandomHorizontalFlip, ToTensor,
Normalize and InterpolationMode, for PIL images (and Normalize for tensors), as the example scripts use them."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

from . import functional

__all__ = ["CenterCrop", "Compose", "InterpolationMode", "Normalize", "RandomCrop", "RandomHorizontalFlip", "Resize",
           "ToTensor", "functional"]


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def _pil_filter(mode: InterpolationMode) -> int:
    from PIL import Image

    return {InterpolationMode.NEAREST: Image.NEAREST, InterpolationMode.BILINEAR: Image.BILINEAR,
            InterpolationMode.BICUBIC: Image.BICUBIC, InterpolationMode.LANCZOS: Image.LANCZOS}[mode]  # fmt: skip


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) of a crop size given as one int or a (height, width) pair."""
    if isinstance(size, int):
        return size, size
    return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


class Resize:
    """An int ``size`` is the new shorter side (the longer one keeps the aspect ratio, truncated); a pair is (h, w)."""

    def __init__(self, size: int | Sequence[int], interpolation: InterpolationMode = InterpolationMode.BILINEAR) -> None:
        self.size = size
        self.interpolation = interpolation

    def __call__(self, img: Any) -> Any:
        w, h = img.size
        if isinstance(self.size, int) or len(self.size) == 1:
            short = self.size if isinstance(self.size, int) else int(self.size[0])
            if w <= h:
                new_w, new_h = short, int(short * h / w)
            else:
                new_w, new_h = int(short * w / h), short
        else:
            new_h, new_w = int(self.size[0]), int(self.size[1])
        if (new_w, new_h) == (w, h):
            return img
        return img.resize((new_w, new_h), _pil_filter(self.interpolation))


class CenterCrop:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def __call__(self, img: Any) -> Any:
        th, tw = self.size
        w, h = img.size
        return functional.crop(img, round((h - th) / 2.0), round((w - tw) / 2.0), th, tw)


class RandomCrop:
    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    @staticmethod
    def get_params(img: Any, output_size: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, left, height, width) of a uniformly placed ``output_size`` crop, drawn from torch's RNG."""
        import torch

        w, h = img.size
        th, tw = output_size
        if h < th or w < tw:
            raise ValueError(f"required crop size {(th, tw)} is larger than the input image size {(h, w)}")
        if (w, h) == (tw, th):
            return 0, 0, h, w
        i = int(torch.randint(0, h - th + 1, size=(1,)).item())
        j = int(torch.randint(0, w - tw + 1, size=(1,)).item())
        return i, j, th, tw

    def __call__(self, img: Any) -> Any:
        return functional.crop(img, *self.get_params(img, self.size))


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, img: Any) -> Any:
        import torch
        from PIL import Image

        if torch.rand(1).item() < self.p:
            return img.transpose(Image.FLIP_LEFT_RIGHT)
        return img


class ToTensor:
    """A PIL image -> a float32 (C, H, W) tensor in [0, 1]."""

    def __call__(self, pic: Any) -> Any:
        import numpy as np
        import torch

        arr = np.array(pic, dtype=np.uint8, copy=True)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr).permute(2, 0, 1).contiguous().float().div(255)


class Normalize:
    """(x - mean) / std per channel; a one-element mean/std applies to every channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = list(mean)
        self.std = list(std)

    def __call__(self, tensor: Any) -> Any:
        import torch

        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std
