"""The optimizer, its learning-rate schedule and how a training step calls them."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from te_align._compat import _key
from te_align.train.config import TrainConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from accelerate import Accelerator

logger = logging.getLogger("te_align.train")


def lr_lambda(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "cosine":
            span = max(1, total - warmup)
            progress = min(1.0, (step - warmup) / span)
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return f


#: The first bitsandbytes whose AdamW8bit steps on the CPU (0.48/0.49 crash in the first step's 32-bit update).
CPU_ADAMW8BIT = (0, 50)


def make_optimizer(cfg: TrainConfig, groups: list[dict[str, object]], device: torch.device) -> torch.optim.Optimizer:
    import importlib.util

    import torch

    t = cfg.train
    kw: dict[str, Any] = {"betas": (t.adam_beta1, t.adam_beta2), "eps": t.adam_epsilon, "weight_decay": t.weight_decay}
    if t.optimizer == "adamw8bit":
        if importlib.util.find_spec("bitsandbytes") is None:
            logger.warning("train.optimizer = adamw8bit needs bitsandbytes (pip install bitsandbytes); using torch AdamW")
        else:
            import bitsandbytes as bnb

            version = getattr(bnb, "__version__", "0")
            if device.type == "cpu" and _key(version) < CPU_ADAMW8BIT:
                # 0.48 and 0.49 build the optimizer on CPU, then fail inside its first step (tools/deps.py lowest)
                logger.warning("train.optimizer = adamw8bit on the CPU needs bitsandbytes >= %s (installed: %s; "
                               "pip install \"te-align[bnb]\"); using torch AdamW",
                               ".".join(map(str, CPU_ADAMW8BIT)), version)
                return torch.optim.AdamW(groups, **kw)
            try:
                return bnb.optim.AdamW8bit(groups, **kw)
            except Exception as e:  # an old bitsandbytes without this device's kernels
                logger.warning("train.optimizer = adamw8bit: bitsandbytes %s cannot run on %s (%s); using torch AdamW",
                               getattr(bnb, "__version__", "?"), device.type, str(e).splitlines()[0] if str(e) else type(e).__name__)
    return torch.optim.AdamW(groups, **kw)


def direct_step(
    accelerator: Accelerator, optimizer: torch.optim.Optimizer, trainable: list[torch.nn.Parameter]
) -> tuple[Callable[[], object], Callable[[float], object]]:
    """(optimizer step, gradient clip) without accelerate's per-step wrapper work where it adds nothing.

    ``AcceleratedOptimizer.step`` looks up the optional ``lomo_optim`` package twice per call (a
    filesystem search) and ``Accelerator.clip_grad_norm_`` walks every parameter in Python looking
    for DTensors before calling ``torch.nn.utils.clip_grad_norm_``; at small model sizes that is a
    measurable share of a step. Without a gradient scaler (fp16) and outside XLA/DeepSpeed/FSDP the
    wrapper's step is exactly the inner optimizer's step (te-align does its own accumulation, so
    ``sync_gradients`` is always true here) and the clip is exactly torch's, so both are called
    directly. Otherwise accelerate's own methods run.
    """
    import torch
    from accelerate.utils import DistributedType

    plain = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
    inner = getattr(optimizer, "optimizer", None)
    if inner is None or getattr(optimizer, "scaler", None) is not None or accelerator.distributed_type not in plain:
        return optimizer.step, lambda norm: accelerator.clip_grad_norm_(trainable, norm)
    return inner.step, lambda norm: torch.nn.utils.clip_grad_norm_(trainable, norm)


__all__ = ["CPU_ADAMW8BIT", "direct_step", "lr_lambda", "make_optimizer"]
