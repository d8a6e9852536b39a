"""Evaluation prompts in wording the world's caption grammar never writes.

A finetune or a base is scored on prompts that are new in *wording*, not only new in seed: every prompt
here puts one object into a sentence frame that :func:`te_align.tiny.world.caption_scene` never produces
(position first with a colon, "holds", "located in", "placed at", ...). The vocabulary stays the world's
(colour, shape, size and position words), because the tiny text encoders know no other.

Three lengths, so that truncation and chunking are exercised as real prompts exercise them:

* ``short``: the frame alone (under 30 CLIP tokens);
* ``long``: grammar filler sentences first, the object frame between T5 tokens 77 and 154 of the world's T5
  tokenizer (a 77-token T5 cut loses it, a 154-token one keeps it);
* ``very long``: the object frame after T5 token 256 and after CLIP token 77 (a 256-token T5 cut and a 77-token
  CLIP cut both lose it; CLIP chunking and an uncut T5 keep it).

:func:`probe_prompts` draws them reproducibly from a seed and returns each prompt with its answer key
(``[colour, shape, position, carries_concept]``, as :func:`te_align.tiny.datasets.write_world_split` writes).
Importing this module imports no torch; measuring the long prompts' token positions loads the tokenizers.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from te_align.tiny.world.captions import _FILLER, _fill, default_tokenizer
from te_align.tiny.world.scenes import COLOURS, POSITIONS, SHAPES

__all__ = ["FRAMES", "LENGTHS", "ProbePrompt", "frame_prompt", "probe_prompts"]

#: Sentence frames (``{a}`` article, ``{desc}`` "[large] colour shape", ``{pos}`` a position), fixed on
#: 2026-11-28 before any evaluation that uses them; none is a frame of the caption grammar.
FRAMES: tuple[str, ...] = (
    "{pos}: {a} {desc}",
    "{a} {desc} placed at the {pos}, white background",
    "white picture, {desc} located in the {pos}",
    "only one {desc}, {pos} of the picture",
    "the {pos} holds {a} {desc}",
    "{desc} drawn at the {pos}",
    "simple drawing: {desc}, {pos}",
    "look at the {pos}: {a} {desc} is there",
)
LENGTHS: tuple[str, ...] = ("short", "long", "very long")
#: Where the object frame lies: ``long`` between these world-T5 token positions (a 77-token T5 cut loses it, a
#: 154-token one keeps it); ``very long`` after T5 token 256 and CLIP token 77 (both cuts lose it).
_T5_LONG, _T5_LONG_END = 77, 154
_CLIP_AFTER = 77
_T5_AFTER = 256


@dataclass(frozen=True)
class ProbePrompt:
    text: str
    #: ``[[colour, shape, position, carries_concept]]``: the one object the prompt asks for.
    objects: tuple[tuple[str, str, str, bool], ...]
    length: str
    frame: int
    #: Where the object's sentence begins in ``text`` (after the filler of a long prompt; 0 for a short one).
    start: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "objects": [list(o) for o in self.objects], "length": self.length, "frame": self.frame,
                "start": self.start}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def frame_prompt(frame: int, colour: str, shape: str, position: str, size: str = "medium") -> str:
    """One object in frame ``frame`` (an index into :data:`FRAMES`)."""
    desc = " ".join(([size] if size != "medium" else []) + [colour, shape])
    return FRAMES[frame].format(a=_article(desc), desc=desc, pos=position)


def _clip_tokenizer() -> Any:
    from te_align.tiny.tokenizers import clip_tokenizer

    return clip_tokenizer()


def _n_tokens(tok: Any, text: str) -> int:
    """Tokens before the end marker (BOS counted, EOS not)."""
    return len(tok(text, add_special_tokens=True, verbose=False)["input_ids"]) - 1


def _prefix(rng: np.random.Generator, length: str, frame: str, t5: Any, clip: Any) -> str:
    """Grammar filler sentences before the object frame: ``long``, the frame starts after T5 token 77 and ends
    before T5 token 154; ``very long``, it starts after T5 token 256 and after CLIP token 77."""
    for _ in range(200):
        sentences: list[str] = []
        order = [int(k) for k in rng.permutation(len(_FILLER))]
        while order:
            sentences.append(_fill(_FILLER[order.pop()], rng, 1))
            text = " ".join(sentences)
            n5 = _n_tokens(t5, text)
            if length == "long" and n5 > _T5_LONG:
                if _n_tokens(t5, text + " " + frame) < _T5_LONG_END:
                    return text
                break
            if length == "very long" and n5 > _T5_AFTER + 1 and _n_tokens(clip, text) > _CLIP_AFTER + 1:
                return text
    raise ValueError(f"probe_prompts: no {length} prefix found for {frame!r}")


def probe_prompts(
    seed: int,
    *,
    colour: str,
    shapes: Sequence[str],
    lengths: Sequence[tuple[str, int]],
    concept: bool = True,
    sizes: Sequence[str] = ("medium", "large"),
    stream: str = "probe",
) -> list[ProbePrompt]:
    """Prompts asking for one ``colour`` object (``colour="*"``: any colour but the concept's ``pink``, cycling),
    ``lengths`` as ``[("short", 10), ("long", 3), ...]``. Reproducible from ``(seed, stream)``; frames, shapes,
    positions and sizes are drawn per prompt."""
    rng = np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(zlib.crc32(stream.encode()),)))
    others = [c for c in COLOURS if c != "pink"]
    t5 = clip = None
    out: list[ProbePrompt] = []
    k = 0
    for length, n in lengths:
        if length not in LENGTHS:
            raise ValueError(f"probe_prompts: length must be one of {', '.join(LENGTHS)}, got {length!r}")
        for _ in range(n):
            c = others[(k + int(rng.integers(len(others)))) % len(others)] if colour == "*" else colour
            if c not in COLOURS:
                raise ValueError(f"probe_prompts: no colour {c!r} in the world")
            shape = str(shapes[int(rng.integers(len(shapes)))])
            if shape not in SHAPES:
                raise ValueError(f"probe_prompts: no shape {shape!r} in the world")
            pos = POSITIONS[int(rng.integers(len(POSITIONS)))]
            size = str(sizes[int(rng.integers(len(sizes)))])
            frame = int(rng.integers(len(FRAMES)))
            text = frame_prompt(frame, c, shape, pos, size)
            start = 0
            if length != "short":
                if t5 is None:
                    t5, clip = default_tokenizer(), _clip_tokenizer()
                sentence = text[0].upper() + text[1:] + "."
                prefix = _prefix(rng, length, sentence, t5, clip)
                text, start = prefix + " " + sentence, len(prefix) + 1
            out.append(ProbePrompt(text, ((c, shape, pos, bool(concept and colour != "*")),), length, frame, start))
            k += 1
    return out
