"""Text encoders that carry meaning: the tiny CLIP-L, CLIP-G and T5 briefly pretrained on world captions.

Real diffusion models condition on pretrained text encoders whose token states already say what a word means
in its sentence; the tiny random encoders of :func:`te_align.tiny.encoders.family_components` do not, and a
denoiser that has to work that out from scratch learns its prompts far too slowly on CPU (issue 25). This
module pretrains the same classes, widths, vocabularies and tokenizers on captions of the shapes world with
an attribute objective, then freezes them; the result is shared by every family, as the real models share
encoders (SD 1.5, SDXL, SD3 and Flux all use OpenAI CLIP ViT-L/14; SDXL and SD3 OpenCLIP bigG; SD3 and
Flux T5-XXL).

The objective reads each encoder where a pipeline reads it, with the tokenizer settings of the profiles
(CLIP: 77 tokens padded with its pad token and no mask, causal; T5: padded to :attr:`EncoderConfig.t5_length`
with no mask, bidirectional):

* T5 ``last_hidden_state``: every token of an object's description (its span, measured with the tokenizer's
  offsets) predicts that object's colour, shape, position and size; every token predicts whether it belongs
  to a description. A description cut by truncation teaches nothing, so a cut caption carries no object.
* CLIP-L and CLIP-G penultimate hidden states (SD3, SDXL) and CLIP-L's last hidden state after the final layer
  norm (SD 1.5; Flux's ``pooler_output`` is its end-of-text row): a causal token predicts the attributes of
  the object whose description ended last at or before it (later tokens, end-of-text and padding see it).
* ``text_embeds`` of both CLIPs (SD3's and SDXL's pooled vectors): the same target as the end-of-text token.

Heads are linear and thrown away; only the encoders are kept. Captions never mention the held-out concept
(:attr:`EncoderConfig.held_out`), so its word is as untrained in the encoders as in the denoiser. Token
embedding rows of words that never occur keep their initial values (no weight decay). Everything is seeded;
the weights are rounded to float16 values (what is shipped) when training ends.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ATTRIBUTE_SIZES",
    "COMPONENTS",
    "ENCODER_FILES",
    "EncoderConfig",
    "caption_targets",
    "components_for",
    "load_encoders",
    "pretrain_encoders",
    "recase",
    "save_encoders",
]

#: Classes per attribute head (colour includes the held-out colour, which is never a target).
ATTRIBUTE_SIZES: dict[str, int] = {"colour": 8, "shape": 4, "position": 9, "size": 3}
#: Sub-folders of an encoder set.
ENCODER_FILES = ("clip_l", "clip_g", "t5")
MANIFEST = "encoders.json"
#: Per encoder of a set: its component in the SD3-style components dict and its read-out heads (:class:`_Heads`).
_READOUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "clip_l": ("text_encoder", ("clip_l_penultimate", "clip_l_last", "clip_l_embeds")),
    "clip_g": ("text_encoder_2", ("clip_g_penultimate", "clip_g_embeds")),
    "t5": ("text_encoder_3", ("t5",)),
}
#: Per encoder of a set: its component name in SD3's components (:func:`components_for` ``"sd3"``).
COMPONENTS: dict[str, str] = {k: comp for k, (comp, _) in _READOUTS.items()}


@dataclass(frozen=True)
class EncoderConfig:
    """Everything that decides the pretrained encoders (with the torch version and thread count)."""

    seed: int = 0
    captions: int = 24000  # training captions, half from each scene space in ``worlds``
    worlds: tuple[str, ...] = ("full", "simple")
    steps: int = 2000
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100
    # T5 is padded to these lengths in turn (step % len): the profiles' 256 (SD3, Flux schnell) most often, and the
    # lengths trainers use (77, 154), so the states do not depend on one amount of padding
    t5_lengths: tuple[int, ...] = (256, 154, 256, 77)
    held_out: str = "colour=pink"
    # continue from this encoder set's weights (a folder of save_encoders) instead of the random tiny encoders;
    # "" (every shipped set so far): from scratch. Fresh read-out heads either way.
    init: str = ""
    # train only these of ENCODER_FILES (the others are kept as they are, byte for byte); () : all three
    train_only: tuple[str, ...] = ()
    # each word of each training caption is written with a capital first letter with this probability, one seeded
    # draw per word (:func:`recase`): a stand-in for the cased text a real T5 was pretrained on, where a word and its
    # capitalised form mean the same. 0.0 (every shipped set so far): the captions as the grammar writes them.
    # The held-out read-out captions are never recased. CLIP's tokenizers lower-case, so only T5 sees it.
    case: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_only", tuple(self.train_only))
        object.__setattr__(self, "worlds", tuple(self.worlds))
        object.__setattr__(self, "t5_lengths", tuple(self.t5_lengths))
        bad = [k for k in self.train_only if k not in ENCODER_FILES]
        if bad:
            raise ValueError(f"EncoderConfig.train_only: unknown encoder(s) {bad}; expected some of {list(ENCODER_FILES)}")
        if not 0.0 <= self.case <= 1.0:
            raise ValueError(f"EncoderConfig.case: {self.case} is not a probability (expected 0.0 to 1.0)")
        if self.init and not all((Path(self.init) / k / "model.safetensors").is_file() for k in ENCODER_FILES):
            raise ValueError(f"EncoderConfig.init: {self.init} is not an encoder set (expected "
                             f"{', '.join(k + '/model.safetensors' for k in ENCODER_FILES)})")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["worlds"] = list(self.worlds)
        d["t5_lengths"] = list(self.t5_lengths)
        for key, default in (("init", ""), ("train_only", ()), ("case", 0.0)):  # absent at their defaults: the older manifests' form
            if getattr(self, key) == default:
                d.pop(key)
            elif key == "train_only":
                d[key] = list(self.train_only)
        return d


# --------------------------------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------------------------------


def _attr_index(obj: Any) -> tuple[int, int, int, int]:
    from te_align.tiny import world

    return (
        list(world.COLOURS).index(obj.colour),
        world.SHAPES.index(obj.shape),
        world.POSITIONS.index(obj.position),
        list(world.SIZES).index(obj.size),
    )


def caption_targets(samples: Sequence[Any], tokenizer: Any, max_length: int, causal: bool) -> dict[str, Any]:
    """Token ids and per-token targets of ``samples`` (world :class:`Sample` records) for one tokenizer.

    Returns ``input_ids`` (N, L), ``attrs`` (N, L, 4) class indices with -1 where a token has no target, and
    ``inside`` (N, L) 1.0 for tokens of a (complete) object description. ``causal``: CLIP's rule (a token's
    target is the object whose description ended last at or before it), else T5's (the span's own tokens).
    A description that does not end before the end-of-text token (truncated) gives no target.
    """
    import torch

    from te_align.tiny import world

    texts = [s.caption for s in samples]
    enc = tokenizer(texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")
    ids = enc["input_ids"]
    n, length = ids.shape
    attrs = torch.full((n, length, 4), -1, dtype=torch.long)
    inside = torch.zeros(n, length)
    for i, s in enumerate(samples):
        n_tok, spans = world.token_spans(tokenizer, s.caption, [(sp.char_start, sp.char_end) for sp in s.spans])
        eos = min(n_tok, max_length) - 1  # the end-of-text token's position after truncation
        done = sorted(((sp.token_end, k) for k, sp in enumerate(spans) if sp.token_end > sp.token_start
                       and sp.token_end <= eos), key=lambda x: x[0])  # fmt: skip
        for end, k in done:
            target = torch.tensor(_attr_index(s.objects[k]))
            if causal:
                attrs[i, end - 1 :] = target  # later objects overwrite: the last complete description wins
            else:
                attrs[i, spans[k].token_start : end] = target
                inside[i, spans[k].token_start : end] = 1.0
    return {"input_ids": ids, "attrs": attrs, "inside": inside}


# --------------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------------


def _training_samples(cfg: EncoderConfig, n: int, seed: int) -> list[Any]:
    from te_align.tiny import world

    concept = None
    if cfg.held_out:
        attribute, _, value = cfg.held_out.partition("=")
        concept = world.Concept(attribute, value)
    per = [n // len(cfg.worlds) + (1 if k < n % len(cfg.worlds) else 0) for k in range(len(cfg.worlds))]
    out: list[Any] = []
    for name, m in zip(cfg.worlds, per, strict=True):
        out += world.make_dataset(m, seed, space=world.SPACES[name], image_size=None, tokenizer=False,
                                  split="base" if concept else "all", concept=concept)  # fmt: skip
    return out


def recase(samples: Sequence[Any], p: float, seed: int) -> list[Any]:
    """``samples`` with each word's first letter capitalised with probability ``p`` (one draw per word, seeded).

    Only the case of a word's first letter changes, so every caption keeps its length and its spans' character
    offsets; ``p == 0`` returns the samples unchanged.
    """
    import random
    import re

    if p <= 0.0:
        return list(samples)
    rng = random.Random(seed)

    def up(m: re.Match[str]) -> str:
        return m.group(0).upper() if rng.random() < p else m.group(0)

    return [dataclasses.replace(s, caption=re.sub(r"(?<![A-Za-z'])[a-z]", up, s.caption)) for s in samples]


def _base_components() -> dict[str, Any]:
    """The tiny encoders (SD3's set: CLIP-L and CLIP-G with projection, T5) and their tokenizers, float32."""
    from te_align.tiny.encoders import family_components

    return family_components("sd3")


def _ce(logits: Any, target: Any) -> Any:
    """Mean cross-entropy over the four attribute heads for rows with a target (``target[:, 0] >= 0``)."""
    import torch

    keep = target[:, 0] >= 0
    if not bool(keep.any()):
        return logits.sum() * 0.0
    logits, target = logits[keep], target[keep]
    loss = logits.new_zeros(())
    start = 0
    for j, k in enumerate(ATTRIBUTE_SIZES.values()):
        loss = loss + torch.nn.functional.cross_entropy(logits[:, start : start + k], target[:, j])
        start += k
    return loss


def _accuracy(logits: Any, target: Any) -> list[float]:
    keep = target[:, 0] >= 0
    logits, target = logits[keep], target[keep]
    out, start = [], 0
    for j, k in enumerate(ATTRIBUTE_SIZES.values()):
        out.append(float((logits[:, start : start + k].argmax(1) == target[:, j]).float().mean()) if len(target) else math.nan)
        start += k
    return out


class _Heads:
    """Linear read-outs of every encoder output the pipelines use (thrown away after training)."""

    def __init__(self, comps: dict[str, Any]) -> None:
        import torch

        n = sum(ATTRIBUTE_SIZES.values())
        wl = comps["text_encoder"].config.hidden_size
        wg = comps["text_encoder_2"].config.hidden_size
        w5 = comps["text_encoder_3"].config.d_model
        self.layers = torch.nn.ModuleDict({
            "clip_l_penultimate": torch.nn.Linear(wl, n), "clip_l_last": torch.nn.Linear(wl, n),
            "clip_l_embeds": torch.nn.Linear(comps["text_encoder"].config.projection_dim, n),
            "clip_g_penultimate": torch.nn.Linear(wg, n),
            "clip_g_embeds": torch.nn.Linear(comps["text_encoder_2"].config.projection_dim, n),
            "t5": torch.nn.Linear(w5, n + 1),
        })  # fmt: skip


def _forward(comps: dict[str, Any], heads: Any, batch: dict[str, Any],
             parts: Sequence[str] = ENCODER_FILES) -> tuple[Any, dict[str, list[float]]]:  # fmt: skip
    """Summed losses of the read-outs of ``parts`` on one batch, and per-read-out accuracies (colour, shape,
    position, size)."""
    import torch

    total = 0.0
    acc: dict[str, list[float]] = {}
    for key in ("clip_l", "clip_g"):
        enc_name, heads_of = _READOUTS[key]
        if key not in parts:
            continue
        b = batch[key]
        out = comps[enc_name](b["input_ids"], output_hidden_states=True)
        tgt = b["attrs"].reshape(-1, 4)
        eos = b["input_ids"].eq(49407).int().argmax(dim=1)  # the first end-of-text token (CLIP pools there)
        pooled_tgt = b["attrs"][torch.arange(len(eos)), eos]
        feats = {
            f"{key}_penultimate": (out.hidden_states[-2].reshape(-1, out.hidden_states[-2].shape[-1]), tgt),
            f"{key}_last": (out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1]), tgt),
            f"{key}_embeds": (out.text_embeds, pooled_tgt),
        }
        for h in heads_of:
            x, t = feats[h]
            logits = heads.layers[h](x)
            total = total + _ce(logits, t)
            acc[h] = _accuracy(logits.detach(), t)
    if "t5" not in parts:
        return total, acc
    b = batch["t5"]
    hidden = comps[COMPONENTS["t5"]](b["input_ids"])[0]
    logits = heads.layers["t5"](hidden).reshape(-1, sum(ATTRIBUTE_SIZES.values()) + 1)
    tgt = b["attrs"].reshape(-1, 4)
    total = total + _ce(logits[:, :-1], tgt)
    total = total + torch.nn.functional.binary_cross_entropy_with_logits(logits[:, -1], b["inside"].reshape(-1))
    acc["t5"] = _accuracy(logits[:, :-1].detach(), tgt)
    return total, acc


def _batches(comps: dict[str, Any], samples: Sequence[Any], t5_lengths: Sequence[int]) -> dict[str, dict[str, Any]]:
    out = {
        "clip_l": caption_targets(samples, comps["tokenizer"], 77, causal=True),
        "clip_g": caption_targets(samples, comps["tokenizer_2"], 77, causal=True),
    }
    for length in sorted(set(t5_lengths)):
        out[f"t5-{length}"] = caption_targets(samples, comps["tokenizer_3"], length, causal=False)
    return out


def _select(data: dict[str, dict[str, Any]], idx: Any, t5_length: int) -> dict[str, dict[str, Any]]:
    """The rows ``idx`` of the CLIP data and of the T5 data padded to ``t5_length``."""
    out = {k: {kk: vv[idx] for kk, vv in data[k].items()} for k in ("clip_l", "clip_g")}
    out["t5"] = {kk: vv[idx] for kk, vv in data[f"t5-{t5_length}"].items()}
    return out


def pretrain_encoders(
    cfg: EncoderConfig, log: Callable[[dict[str, Any]], None] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train the three tiny encoders on world captions; returns (SD3-style components dict, metrics).

    The components dict has the tokenizers and the trained, frozen encoders (float32 holding float16 values)
    under SD3's names; :func:`components_for` arranges them for another family.
    """
    import torch

    from te_align.tiny._seed import seeded

    comps = _base_components()
    if cfg.init:
        for name, model in load_encoders(cfg.init).items():
            comps[COMPONENTS[name]].load_state_dict(model.state_dict(), strict=True)
    parts = cfg.train_only or ENCODER_FILES
    encoders = [comps[COMPONENTS[k]] for k in parts]
    for k in ENCODER_FILES:
        if k not in parts:
            comps[COMPONENTS[k]].eval().requires_grad_(False)
    t0 = time.perf_counter()
    train = recase(_training_samples(cfg, cfg.captions, cfg.seed), cfg.case, cfg.seed * 1000 + 14)
    held = _training_samples(cfg, 1000, cfg.seed + 50_000)
    data = _batches(comps, train, cfg.t5_lengths)
    held_data = _batches(comps, held, (256,))
    if log:
        log({"phase": "encoder_data", "captions": len(train), "seconds": round(time.perf_counter() - t0, 1)})
    with seeded(cfg.seed * 1000 + 11):
        heads = _Heads(comps)
    params = [p for m in encoders for p in m.parameters()]
    params += [p for k in parts for h in _READOUTS[k][1] for p in heads.layers[h].parameters()]
    for m in encoders:
        m.train()
        m.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 12)
    n = len(train)
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 1000 + 13)  # dropout inside T5
        for step in range(cfg.steps):
            idx = torch.randint(0, n, (cfg.batch,), generator=gen)
            loss, _ = _forward(comps, heads, _select(data, idx, cfg.t5_lengths[step % len(cfg.t5_lengths)]), parts)
            lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if log and (step + 1) % 100 == 0:
                log({"phase": "encoders", "step": step + 1, "loss": round(float(loss), 4),
                     "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
    metrics: dict[str, Any] = {"train_seconds": round(time.perf_counter() - t0, 1)}
    with torch.no_grad():
        for m in encoders:
            m.eval().requires_grad_(False)
            for p in m.parameters():
                p.copy_(p.half().float())
        _, acc = _forward(comps, heads, _select(held_data, torch.arange(len(held)), 256), parts)
    metrics["heldout_accuracy"] = {k: dict(zip(ATTRIBUTE_SIZES, v, strict=True)) for k, v in acc.items()}
    if log:
        log({"phase": "encoders_done", **metrics})
    return comps, metrics


# --------------------------------------------------------------------------------------------------
# saving, loading, per-family components
# --------------------------------------------------------------------------------------------------


def save_encoders(comps: dict[str, Any], folder: str | Path, *, config: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Write the three encoders (``save_pretrained``, safetensors) and ``encoders.json`` into ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name in ENCODER_FILES:
        comps[COMPONENTS[name]].save_pretrained(str(out / name), safe_serialization=True)
    (out / MANIFEST).write_text(json.dumps({"config": config, "metrics": metrics}, indent=1, sort_keys=True) + "\n",
                                encoding="utf-8")  # fmt: skip
    return out


def load_encoders(folder: str | Path) -> dict[str, Any]:
    """The three encoders of an encoder set (float32, eval mode, frozen) keyed by :data:`ENCODER_FILES`."""
    import transformers

    root = Path(folder)
    out = {
        "clip_l": transformers.CLIPTextModelWithProjection.from_pretrained(str(root / "clip_l")),
        "clip_g": transformers.CLIPTextModelWithProjection.from_pretrained(str(root / "clip_g")),
        "t5": transformers.T5EncoderModel.from_pretrained(str(root / "t5")),
    }
    for m in out.values():
        m.float().eval().requires_grad_(False)
    return out


def clip_tower_state(with_projection: Any, plain: Any) -> dict[str, Any]:
    """The text tower's weights of a ``CLIPTextModelWithProjection`` under ``plain``'s (a ``CLIPTextModel``'s) names.

    The projection is dropped; the tower's names differ between the classes in some transformers versions
    (``text_model.`` prefix or none), so they are matched by suffix."""
    tower = {k.removeprefix("text_model."): v for k, v in with_projection.state_dict().items() if not k.startswith("text_projection.")}
    return {k: tower[k.removeprefix("text_model.")] for k in plain.state_dict()}


def _without_projection(model: Any) -> Any:
    """A ``CLIPTextModel`` with the text tower of a ``CLIPTextModelWithProjection`` (its projection dropped)."""
    import transformers

    plain = transformers.CLIPTextModel(model.config)
    plain.load_state_dict(clip_tower_state(model, plain), strict=True)
    return plain.float().eval().requires_grad_(False)


def components_for(family: str, encoders: dict[str, Any]) -> dict[str, Any]:
    """``family``'s tokenizers and text encoders (diffusers component names) built from a shared encoder set.

    The classes are the ones of :func:`te_align.tiny.encoders.family_components`: SD3 CLIP-L and CLIP-G with
    projection and T5; Flux CLIP-L (``CLIPTextModel``) and T5; SDXL CLIP-L (``CLIPTextModel``) and CLIP-G with
    projection; SD 1.5 CLIP-L (``CLIPTextModel``); Chroma T5 alone.
    """
    from te_align.tiny import tokenizers as tok

    clip_eot = tok.clip_tokenizer(pad="<|endoftext|>")
    if family == "sd3":
        return {"tokenizer": clip_eot, "text_encoder": encoders["clip_l"], "tokenizer_2": tok.clip_tokenizer(pad="!"),
                "text_encoder_2": encoders["clip_g"], "tokenizer_3": tok.t5_tokenizer(), "text_encoder_3": encoders["t5"]}  # fmt: skip
    if family == "flux":
        return {"tokenizer": clip_eot, "text_encoder": _without_projection(encoders["clip_l"]),
                "tokenizer_2": tok.t5_tokenizer(), "text_encoder_2": encoders["t5"]}  # fmt: skip
    if family == "sdxl":
        return {"tokenizer": clip_eot, "text_encoder": _without_projection(encoders["clip_l"]),
                "tokenizer_2": tok.clip_tokenizer(pad="!"), "text_encoder_2": encoders["clip_g"]}  # fmt: skip
    if family == "sd15":
        return {"tokenizer": clip_eot, "text_encoder": _without_projection(encoders["clip_l"])}
    if family == "chroma":  # T5 alone, as ChromaPipeline (the T5 SD3 and Flux share)
        return {"tokenizer": tok.t5_tokenizer(), "text_encoder": encoders["t5"]}
    raise ValueError(f"components_for: no world encoders for family {family!r}")
