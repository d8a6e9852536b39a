"""``torchvision.transforms.functional`` stand-in: the PIL functions the example scripts call."""

from __future__ import annotations

from typing import Any


def crop(img: Any, top: int, left: int, height: int, width: int) -> Any:
    """The ``height`` x ``width`` box of PIL image ``img`` whose top-left corner is (``top``, ``left``)."""
    return img.crop((left, top, left + width, top + height))
