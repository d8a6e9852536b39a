"""The klein world base's text encoder: the tiny Qwen3 of :mod:`te_align.tiny.klein` pretrained on world captions.

The shared CLIP and T5 encoders (:mod:`world_pretrain.encoders`) were pretrained with linear attribute read-outs
where each pipeline reads them. The klein base's encoder is a decoder-only LLM, read by ``Flux2KleinPipeline`` at
three inner layers (``hidden_states[9, 18, 27]``), and the study's question is what reading *other* layers does. So
its read-outs sit where no tap is: on the final normed output (``last_hidden_state``), which neither the official
nor the deviating taps are; every inner layer, the official and the deviating ones alike, carries the attributes only
as the residual path to that output (benchmarks/klein/bench_klein.md section 1 says why: a read-out on the official
taps would make them, and not their neighbours, linearly readable, and so enlarge the layers row's effect).

Each caption is written the way the pipeline writes it (its chat template, ``enable_thinking`` off, one user
message, the generation prompt; ``Flux2KleinPipeline._get_qwen3_prompt_embeds``) and padded on the right, with the
attention mask into the encoder. The loss is the sum of

* next-token cross-entropy on every real token (the encoder is a causal LM, as the real Qwen3 is); and
* linear colour, shape, position and size read-outs of the final output at every token from the end of each
  object's description on (causal: those tokens have seen the whole description; later objects overwrite), the
  template's suffix and the padding included (the denoiser reads every one of the 512 positions).

Batches are padded to their longest caption on three steps of four and to 512 on the fourth
(:attr:`KleinEncoderConfig.pad_cycle`), so the padding states at every position the denoiser reads are trained.
Captions never mention the held-out concept. Everything is seeded; training checkpoints every
:attr:`KleinEncoderConfig.checkpoint_every` steps and resumes from the last checkpoint bit for bit; the weights are
rounded to float16 values when training ends (what is shipped).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_align.tiny.world import scenes
from world_pretrain.encoders import ATTRIBUTE_SIZES, recase

__all__ = ["ATTRIBUTE_WORDS", "KleinEncoderConfig", "klein_targets", "load_klein_encoder", "pretrain_klein_encoder", "templated", "vary"]

MANIFEST = "encoders.json"
FOLDER = "qwen3"
CHECKPOINT = "checkpoint.pt"
#: The window the pipeline pads to (``max_sequence_length`` 512, pipeline_flux2_klein.py:214).
WINDOW = 512


@dataclass(frozen=True)
class KleinEncoderConfig:
    """Everything that decides the klein encoder (with the torch version and thread count)."""

    seed: int = 0
    captions: int = 24000  # training captions, half from each scene space in ``worlds``
    worlds: tuple[str, ...] = ("full", "simple")
    steps: int = 2000
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100
    # padding per step, in turn (step % len): 0 = to the batch's longest caption, else to that many tokens
    pad_cycle: tuple[int, ...] = (0, 0, 0, WINDOW)
    held_out: str = "colour=pink"
    lm_weight: float = 1.0
    checkpoint_every: int = 250
    # continue from this encoder set's weights (a folder written by save_klein_encoder); fresh read-out heads
    init: str = ""
    # each word of each training caption is written with a capital first letter with this probability (one seeded
    # draw per word, world_pretrain.encoders.recase: the T5's case of bench_learnability.md amendment 11); the
    # held-out captions are never recased. 0.0: the captions as the grammar writes them (every set before amendment 13)
    case: float = 0.0
    # random insertion and deletion of words (EDA, Wei & Zou 2019, "easy data augmentation", its alpha 0.1): after each
    # word of a training caption another word is inserted with probability ``insert``, and each word is deleted
    # with probability ``delete``; attribute words (:data:`ATTRIBUTE_WORDS`) are never deleted nor inserted, the
    # inserted words are drawn from the training captions' own other words, and every object's span follows the
    # edit (:func:`vary`). The held-out captions are never varied. 0.0: as the grammar writes them (before amendment 13)
    insert: float = 0.0
    delete: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "worlds", tuple(self.worlds))
        object.__setattr__(self, "pad_cycle", tuple(int(x) for x in self.pad_cycle))
        if any(x < 0 or x > WINDOW for x in self.pad_cycle) or not self.pad_cycle:
            raise ValueError(f"KleinEncoderConfig.pad_cycle: expected lengths 0..{WINDOW} (0: the batch's longest), "
                             f"got {list(self.pad_cycle)}")  # fmt: skip
        if isinstance(self.lm_weight, bool) or not isinstance(self.lm_weight, (int, float)) or self.lm_weight < 0:
            raise ValueError(f"KleinEncoderConfig.lm_weight: expected a number >= 0, got {self.lm_weight!r}")
        for key in ("case", "insert", "delete"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"KleinEncoderConfig.{key}: {getattr(self, key)} is not a probability (expected 0.0 to 1.0)")
        if self.init and not (Path(self.init) / FOLDER / "config.json").is_file():
            raise ValueError(f"KleinEncoderConfig.init: {self.init} is not a klein encoder set (expected {FOLDER}/config.json)")

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["worlds"] = list(self.worlds)
        d["pad_cycle"] = list(self.pad_cycle)
        for key, default in (("init", ""), ("case", 0.0), ("insert", 0.0), ("delete", 0.0)):  # absent at their defaults: the older manifests' form
            if d[key] == default:
                d.pop(key)
        return d


def templated(tokenizer: Any, caption: str, *, enable_thinking: bool = False) -> str:
    """``caption`` as ``Flux2KleinPipeline`` writes it before tokenizing (one user message, the generation prompt)."""
    text: str = tokenizer.apply_chat_template([{"role": "user", "content": caption}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=enable_thinking)  # fmt: skip
    return text


def klein_targets(samples: Sequence[Any], tokenizer: Any, length: int = WINDOW) -> dict[str, Any]:
    """Token ids, mask and per-token attribute targets of ``samples`` (world :class:`Sample` records), templated.

    Returns ``input_ids`` and ``attention_mask`` (N, ``length``; right padding, as the pipeline), ``attrs``
    (N, ``length``, 4) int8 class indices, -1 where a token has no target (before the first complete description),
    and ``lengths`` (N,) real tokens. A description cut by truncation teaches nothing.
    """
    import torch

    from te_align.tiny import world
    from world_pretrain.encoders import _attr_index

    texts = [templated(tokenizer, s.caption) for s in samples]
    enc = tokenizer(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    attrs = torch.full((len(samples), length, 4), -1, dtype=torch.int8)
    for i, (s, text) in enumerate(zip(samples, texts, strict=True)):
        at = text.index(s.caption)
        n_tok, spans = world.token_spans(tokenizer, text, [(at + sp.char_start, at + sp.char_end) for sp in s.spans])
        real = min(n_tok, length)
        done = sorted((sp.token_end, k) for k, sp in enumerate(spans) if sp.token_start < sp.token_end <= real)
        for end, k in done:
            attrs[i, end - 1 :] = torch.tensor(_attr_index(s.objects[k]), dtype=torch.int8)
    return {"input_ids": ids, "attention_mask": mask, "attrs": attrs, "lengths": mask.sum(1)}


def _samples(cfg: KleinEncoderConfig, n: int, seed: int) -> list[Any]:
    """``n`` world captions without the held-out concept, half from each scene space (the shared encoders' draw)."""
    from world_pretrain.encoders import _training_samples

    return _training_samples(cfg, n, seed)  # type: ignore[arg-type]  # reads held_out and worlds only


#: Words that name an object's attribute (colour, shape, position, size, the outline style): :func:`vary` never
#: deletes or inserts them, so a varied caption describes its scene as the original does.
ATTRIBUTE_WORDS: frozenset[str] = frozenset(
    (*scenes.COLOURS, *scenes.SHAPES, *scenes.SIZES, *(w for p in scenes.POSITIONS for w in p.split()), "outlined")
)
_WORD = re.compile(r"[A-Za-z']+")


def vary(samples: Sequence[Any], insert: float, delete: float, seed: int) -> list[Any]:
    """``samples`` with words randomly inserted and deleted (EDA's random insertion and deletion; seeded).

    Per word of a caption, in order: it is deleted with probability ``delete`` unless it is an attribute word
    (:data:`ATTRIBUTE_WORDS`; the space before it goes with it, or the one after it where none is before); a word
    kept is then followed, with probability ``insert``, by a space and a word drawn uniformly from the lower-case
    non-attribute words of all of ``samples``' captions. Each object's character span is carried through the edit (a word
    inserted inside a span is inside it); the spans' T5 token fields are set to -1 (nothing here reads them: the
    klein targets are found from the characters). ``insert == delete == 0`` returns the samples unchanged.
    """
    import random

    from te_align.tiny.world.captions import ObjectSpan

    if insert <= 0.0 and delete <= 0.0:
        return list(samples)
    vocab = sorted({w for s in samples for w in _WORD.findall(s.caption) if w.islower()} - ATTRIBUTE_WORDS)
    rng = random.Random(seed)
    out = []
    for s in samples:
        text = s.caption
        new: list[str] = []
        size = 0
        where = [0] * (len(text) + 1)  # old character -> its new index (a deleted one: where it would have been)
        pos = 0
        for m in _WORD.finditer(text):
            gap = text[pos : m.start()]
            cut = m.group(0).lower() not in ATTRIBUTE_WORDS and rng.random() < delete
            lead = cut and gap.endswith(" ")  # a word deleted takes the space before it (at the start: after it)
            if lead:
                gap = gap[:-1]
            for i in range(pos, m.start()):
                where[i] = size + min(i - pos, len(gap))
            new.append(gap)
            size += len(gap)
            end = m.end()
            if cut:
                for i in range(m.start(), m.end()):
                    where[i] = size
                if not lead and text[end : end + 1] == " ":
                    where[end] = size
                    end += 1
            else:
                for i in range(m.start(), m.end()):
                    where[i] = size + i - m.start()
                new.append(m.group(0))
                size += len(m.group(0))
            if not cut and rng.random() < insert:
                word = " " + vocab[rng.randrange(len(vocab))]
                new.append(word)
                size += len(word)
            pos = end
        for i in range(pos, len(text) + 1):
            where[i] = size + i - pos
        new.append(text[pos:])
        caption = "".join(new)
        spans = tuple(ObjectSpan(where[sp.char_start], where[sp.char_end - 1] + 1, -1, -1) for sp in s.spans)
        out.append(dataclasses.replace(s, caption=caption, spans=spans))
    return out


def _heads(width: int, seed: int) -> Any:
    import torch

    from te_align.tiny._seed import seeded

    with seeded(seed):
        return torch.nn.Linear(width, sum(ATTRIBUTE_SIZES.values()))


def _losses(model: Any, heads: Any, batch: dict[str, Any], lm_weight: float) -> tuple[Any, dict[str, Any]]:
    """The summed loss of one batch and its parts (LM cross-entropy, attribute cross-entropy, accuracies)."""
    import torch

    ids, mask, attrs = batch["input_ids"], batch["attention_mask"], batch["attrs"].long()
    hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    logits = model.lm_head(hidden[:, :-1])
    real_next = mask[:, 1:].bool()
    lm = torch.nn.functional.cross_entropy(logits[real_next], ids[:, 1:][real_next])
    keep = attrs[..., 0] >= 0
    out = heads(hidden[keep])
    tgt = attrs[keep]
    attr = hidden.new_zeros(())
    acc = []
    start = 0
    for j, k in enumerate(ATTRIBUTE_SIZES.values()):
        attr = attr + torch.nn.functional.cross_entropy(out[:, start : start + k], tgt[:, j])
        acc.append(float((out[:, start : start + k].argmax(1) == tgt[:, j]).float().mean()) if len(tgt) else math.nan)
        start += k
    parts = {"lm": float(lm.detach()), "attributes": float(attr.detach()), "accuracy": dict(zip(ATTRIBUTE_SIZES, acc, strict=True))}
    return lm_weight * lm + attr, parts


def _select(data: dict[str, Any], idx: Any, pad: int) -> dict[str, Any]:
    length = int(data["lengths"][idx].max()) if pad == 0 else pad
    return {k: data[k][idx, :length] for k in ("input_ids", "attention_mask", "attrs")}


def _initial(cfg: KleinEncoderConfig) -> tuple[Any, Any]:
    from te_align.tiny import tokenizers as tok
    from te_align.tiny.klein import klein_text_encoder

    tokenizer = tok.qwen3_instruct_tokenizer()
    model = load_klein_encoder(cfg.init) if cfg.init else klein_text_encoder(tokenizer)
    return tokenizer, model


def pretrain_klein_encoder(
    cfg: KleinEncoderConfig, work: str | Path, log: Callable[[dict[str, Any]], None] | None = None, *,
    stop_after: int = 0, heldout: int = 1000,
) -> tuple[Any, dict[str, Any]] | None:
    """Train the klein encoder on world captions (checkpointing into ``work``, resuming from it); returns
    (the trained, frozen ``Qwen3ForCausalLM``, metrics), or ``None`` when ``stop_after`` (a time box: stop once the
    checkpoint of that step is written) stopped it. ``heldout``: captions of the final held-out read."""
    import torch

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer, model = _initial(cfg)
    t0 = time.perf_counter()
    train = _samples(cfg, cfg.captions, cfg.seed)
    train = recase(vary(train, cfg.insert, cfg.delete, cfg.seed * 1000 + 15), cfg.case, cfg.seed * 1000 + 14)
    held = _samples(cfg, heldout, cfg.seed + 50_000)
    data = klein_targets(train, tokenizer)
    held_data = klein_targets(held, tokenizer)
    if log:
        log({"phase": "klein_encoder_data", "captions": len(train), "longest": int(data["lengths"].max()),
             "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
    heads = _heads(model.config.hidden_size, cfg.seed * 1000 + 11)
    params = list(model.parameters()) + list(heads.parameters())
    model.train().requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 12)
    start = 0
    elapsed = 0.0
    ckpt = work / CHECKPOINT
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if state["config"] != cfg.as_dict():
            raise SystemExit(f"{ckpt}: written by another configuration ({state['config']}); use another --out")
        model.load_state_dict(state["model"])
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        start, elapsed = state["step"], state["seconds"]
        if log:
            log({"phase": "klein_encoder_resume", "step": start})
    n = len(train)
    t0 = time.perf_counter() - elapsed
    for step in range(start, cfg.steps):
        idx = torch.randint(0, n, (cfg.batch,), generator=gen)
        loss, parts = _losses(model, heads, _select(data, idx, cfg.pad_cycle[step % len(cfg.pad_cycle)]), cfg.lm_weight)
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if log and (step + 1) % 50 == 0:
            log({"phase": "klein_encoder", "step": step + 1, "loss": round(float(loss), 4), "lm": round(parts["lm"], 4),
                 "attributes": round(parts["attributes"], 4), "seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
        if ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == stop_after) and step + 1 < cfg.steps:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"config": cfg.as_dict(), "step": step + 1, "seconds": time.perf_counter() - t0,
                        "model": model.state_dict(), "heads": heads.state_dict(), "optimizer": opt.state_dict(),
                        "generator": gen.get_state()}, tmp)  # fmt: skip
            tmp.replace(ckpt)
            if step + 1 == stop_after:
                return None
    metrics: dict[str, Any] = {"train_seconds": round(time.perf_counter() - t0, 1)}
    with torch.no_grad():
        model.eval().requires_grad_(False)
        for p in model.parameters():
            p.copy_(p.half().float())
        _, parts = _losses(model, heads, _select(held_data, torch.arange(len(held)), WINDOW), cfg.lm_weight)
    metrics["heldout"] = {"lm": round(parts["lm"], 4), "accuracy": parts["accuracy"]}
    if log:
        log({"phase": "klein_encoder_done", **metrics})
    return model, metrics


def save_klein_encoder(model: Any, folder: str | Path, *, config: dict[str, Any], metrics: dict[str, Any]) -> Path:
    """Write the encoder (``save_pretrained``, safetensors) into ``folder/qwen3`` and ``folder/encoders.json``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out / FOLDER), safe_serialization=True)
    (out / MANIFEST).write_text(json.dumps({"config": config, "metrics": metrics, "kind": "klein"}, indent=1,
                                           sort_keys=True) + "\n", encoding="utf-8")  # fmt: skip
    return out


def load_klein_encoder(folder: str | Path) -> Any:
    """The klein encoder of an encoder set written by :func:`save_klein_encoder` (float32, eval, frozen)."""
    import transformers

    model = transformers.Qwen3ForCausalLM.from_pretrained(str(Path(folder) / FOLDER))
    return model.float().eval().requires_grad_(False)
