"""The result of encoding prompts: named tensors plus the profile they were made by.

:class:`Conditioning` is a small read-only mapping ``name -> tensor`` (``prompt_embeds``,
``pooled_prompt_embeds``, ``text_ids``, masks, …) in the order the profile lists its outputs. It
records the profile name and fingerprint so caches and trainers can check where it came from.

Tensors whose first dimension is the batch are *batched*; a tensor without a batch dimension (Flux's
``text_ids`` of shape ``(seq, 3)``) is *shared* by every prompt. Name shared tensors in ``shared``;
tensors not named there are treated as shared too when their first dimension differs from the batch
size. That fallback cannot tell a shared tensor from a batched one when its first dimension happens
to equal the batch size (a (6, 3) ``text_ids`` in a batch of 6 prompts), so encoders must name them.

torch is only imported by the methods that build new tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from te_align._dtypes import dtype_name

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True, eq=False)
class Conditioning(Mapping[str, "torch.Tensor"]):
    """Named conditioning tensors for a batch of prompts, encoded by one profile."""

    tensors: dict[str, torch.Tensor]
    profile_name: str
    fingerprint: str
    #: Real (unpadded) token count per prompt, when the encoder reports it.
    token_counts: list[int] | None = None
    #: Names of tensors that have no batch dimension (kept whole by :meth:`index`).
    shared: tuple[str, ...] = field(default=())
    #: Tensors whose batch dimension is not the first, as (name, dim) pairs: HiDream's Llama
    #: embeddings are (layers, batch, sequence, width), so ``("prompt_embeds_llama3", 1)``.
    batch_dims: tuple[tuple[str, int], ...] = field(default=())

    def __post_init__(self) -> None:
        # A private copy so later changes to the caller's dict cannot change this object.
        object.__setattr__(self, "tensors", dict(self.tensors))
        object.__setattr__(self, "shared", tuple(self.shared))
        object.__setattr__(self, "batch_dims", tuple((str(k), int(d)) for k, d in self.batch_dims))
        if self.token_counts is not None:
            object.__setattr__(self, "token_counts", [int(n) for n in self.token_counts])

    # ----------------------------------------------------------------- mapping
    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{name!r} (this conditioning has: {', '.join(self.tensors)})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    # Tensors have no single truth value, so equality is identity (Mapping's __eq__ would compare them).
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}:{dtype_name(v.dtype)}" for k, v in self.tensors.items())
        return f"Conditioning({self.profile_name} {self.fingerprint}: {shapes})"

    # ------------------------------------------------------------------- batch
    @property
    def batch_size(self) -> int:
        """Number of prompts: ``len(token_counts)`` when known, else dim 0 of the first batched tensor."""
        if self.token_counts is not None:
            return len(self.token_counts)
        for name, t in self.tensors.items():
            d = self.batch_dim(name)
            if name not in self.shared and t.dim() > d:
                return int(t.shape[d])
        return 1

    def batch_dim(self, name: str) -> int:
        """The dimension of tensor ``name`` that indexes prompts (0 unless ``batch_dims`` says otherwise)."""
        return dict(self.batch_dims).get(name, 0)

    def is_batched(self, name: str) -> bool:
        """Whether tensor ``name`` has a leading batch dimension."""
        t = self.tensors[name]
        d = self.batch_dim(name)
        return name not in self.shared and t.dim() > d and int(t.shape[d]) == self.batch_size

    def index(self, i: int) -> Conditioning:
        """Prompt ``i`` alone, as a batch of one (batched tensors sliced ``[i:i+1]``, shared ones kept)."""
        n = self.batch_size
        if not -n <= i < n:
            raise IndexError(f"prompt index {i} out of range for a batch of {n}")
        i %= n
        tensors = {k: (t.narrow(self.batch_dim(k), i, 1) if self.is_batched(k) else t) for k, t in self.tensors.items()}
        counts = None
        if self.token_counts is not None:
            counts = [self.token_counts[i]]
        return Conditioning(tensors, self.profile_name, self.fingerprint, counts, self.shared, self.batch_dims)

    def split(self) -> list[Conditioning]:
        """One batch-1 conditioning per prompt."""
        return [self.index(i) for i in range(self.batch_size)]

    @classmethod
    def cat(cls, items: Sequence[Conditioning]) -> Conditioning:
        """Concatenate conditionings of one profile along the batch (shared tensors taken from the first)."""
        import torch

        if not items:
            raise ValueError("Conditioning.cat needs at least one item")
        first = items[0]
        for c in items[1:]:
            if c.fingerprint != first.fingerprint or list(c) != list(first):
                raise ValueError(
                    f"cannot concatenate conditionings of different profiles or tensor sets "
                    f"({first.profile_name} {first.fingerprint} {list(first)} vs {c.profile_name} {c.fingerprint} {list(c)})"
                )
        tensors = {
            k: (torch.cat([c.tensors[k] for c in items], dim=first.batch_dim(k)) if first.is_batched(k) else t)
            for k, t in first.tensors.items()
        }
        counts: list[int] | None = None
        if all(c.token_counts is not None for c in items):
            counts = [n for c in items for n in (c.token_counts or [])]
        return cls(tensors, first.profile_name, first.fingerprint, counts, first.shared, first.batch_dims)

    def unpad(self, name: str, mask: str) -> list[torch.Tensor]:
        """Tensor ``name`` as one (length_i, ...) tensor per prompt, keeping the positions where ``mask`` is set:
        the list Z-Image's ``encode_prompt`` returns (``prompt_embeds[i][mask[i]]``) from the re-padded tensor
        and its mask (``unpad("prompt_embeds", "prompt_embeds_mask")``)."""
        t, m = self[name], self[mask]
        return [t[i][m[i].bool()] for i in range(t.shape[0])]

    # ------------------------------------------------------------------ moving
    def to(self, device: Any = None, dtype: torch.dtype | None = None, non_blocking: bool = False) -> Conditioning:
        """A copy on ``device``; ``dtype`` applies to floating-point tensors only (ids and masks keep theirs)."""
        out = {}
        for k, t in self.tensors.items():
            target = dtype if (dtype is not None and t.is_floating_point()) else None
            out[k] = t.to(device=device, dtype=target, non_blocking=non_blocking)
        return Conditioning(out, self.profile_name, self.fingerprint, self.token_counts, self.shared, self.batch_dims)


__all__ = ["Conditioning"]
