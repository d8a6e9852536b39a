"""What ``check`` can tell from the captions it can see (``--dataset DIR`` or the config's data folders):
how many contain a literal "!" (CLIP-G pad-token difference) and how many are long enough to pass 512 tokens
(Qwen-Image 1024 vs 512). No tokenizer, no torch: a byte-level BPE token covers at least one UTF-8 byte, so a
caption of at most 512 bytes has at most 512 tokens."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit.parsed import CaptionSource

#: Limits: files read per check, bytes read per caption.
MAX_FILES = 100_000
MAX_CAPTION_BYTES = 1 << 16
CAPTION_EXTENSIONS = (".txt", ".caption")


@dataclass
class CaptionStats:
    folders: list[str] = field(default_factory=list)
    captions: int = 0
    with_bang: int = 0
    over_512_bytes: int = 0
    truncated: bool = False
    #: Per caption: its whitespace-separated words (each is at least one token, so a lower bound of its tokens)
    #: and its bytes (each token covers at least one byte, so an upper bound), for the severity policy's
    #: "tokens cut" (:mod:`te_align.audit.policy`).
    words: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    #: ``check --dataset`` only (:func:`read_dataset`): every caption's text as the trainer's tokenizers get it
    #: (its caption handling applied), the caption files that are not UTF-8 text (path, why), and per encoder slot
    #: the token count of every caption (:mod:`te_align.audit.dataset`; the policy's "tokens cut" then counts them).
    texts: list[str] = field(default_factory=list)
    undecodable: list[tuple[str, str]] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    #: The same with the profile's own template, where the trainer's differs.
    official_tokens: dict[str, list[int]] = field(default_factory=dict)
    #: Slots whose padding reaches what the model sees (:func:`te_align.audit.dataset.padding_seen`).
    padding_seen: set[str] = field(default_factory=set)

    def cut_at(self, length: int) -> tuple[int, int]:
        """Captions a tokenizer cutting at ``length`` tokens certainly cuts (words + 1 special token > length: every
        tokenizer here adds at least an end token) and may cut (bytes + 2 special tokens > length)."""
        return sum(w + 1 > length for w in self.words), sum(b + 2 > length for b in self.sizes)

    def describe(self) -> str:
        where = ", ".join(self.folders)
        return f"{self.captions} caption file(s) in {where}" + (" (first files only)" if self.truncated else "")


def read_captions(folders: list[str], extensions: tuple[str, ...] = CAPTION_EXTENSIONS) -> CaptionStats | None:
    """Count captions in the existing folders (None when none of them exists)."""
    existing = [f for f in dict.fromkeys(folders) if f and Path(f).is_dir()]
    if not existing:
        return None
    stats = CaptionStats(folders=existing)
    exts = tuple(e if e.startswith(".") else f".{e}" for e in extensions)
    for folder in existing:
        for root, dirs, files in os.walk(folder, followlinks=False):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "_t_e_cache"]
            for name in files:
                if not name.lower().endswith(exts):
                    continue
                if stats.captions >= MAX_FILES:
                    stats.truncated = True
                    return stats
                try:
                    with open(os.path.join(root, name), "rb") as fh:
                        data = fh.read(MAX_CAPTION_BYTES + 1)
                except OSError:
                    continue
                stats.captions += 1
                if b"!" in data:
                    stats.with_bang += 1
                text = data.strip()
                if len(text) > 512:
                    stats.over_512_bytes += 1
                stats.words.append(len(text.split()))
                stats.sizes.append(len(text))
    return stats


def read_dataset(sources: list[CaptionSource]) -> CaptionStats | None:
    """The captions of ``sources`` with each trainer's caption handling (its extension, first line only, prefix and
    suffix), decoded as UTF-8: ``texts`` holds them; a file that is not UTF-8 is listed in ``undecodable`` and left
    out. None when no folder exists."""
    existing = [s for s in sources if s.folder and not s.skip and Path(s.folder).is_dir()]
    if not existing:
        return None
    stats = CaptionStats(folders=list(dict.fromkeys(s.folder for s in existing)))
    seen: set[str] = set()
    for src in existing:
        exts = (src.extension if src.extension.startswith(".") else f".{src.extension}",) if src.extension \
            else CAPTION_EXTENSIONS
        for root, dirs, files in os.walk(src.folder, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "_t_e_cache") if src.recursive else []
            for name in sorted(files):
                if not name.lower().endswith(exts):
                    continue
                path = os.path.join(root, name)
                if path in seen:
                    continue
                seen.add(path)
                if stats.captions >= MAX_FILES:
                    stats.truncated = True
                    return stats
                try:
                    with open(path, "rb") as fh:
                        data = fh.read(MAX_CAPTION_BYTES + 1)
                except OSError:
                    continue
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    stats.undecodable.append((path, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"))
                    continue
                pieces = [x for x in text.split("\n") if (x.strip() if src.strip else x)]
                for caption in (pieces if src.each_line and "\n" in text else [text]):
                    _add(stats, src, caption)
    return stats


def _add(stats: CaptionStats, src: CaptionSource, text: str) -> None:
    if src.first_line:
        lines = text.splitlines()
        text = lines[0] if lines else ""
    if src.strip:
        text = text.strip()
    if src.affix_first:
        text = _affix(src, text).strip()
    if src.rejoin is not None:
        pieces = [p.strip() for p in text.split(src.rejoin[0])] if src.rejoin_strip else text.split(src.rejoin[0])
        text = src.rejoin[1].join(p for p in pieces if p or not src.rejoin_drop_empty)
    if src.trigger:
        for tag in ("[name]", "[trigger]"):
            text = text.replace(tag, src.trigger)
        if src.trigger.strip() and src.trigger not in text:
            text = src.trigger + " " + text
    if not src.affix_first:
        text = _affix(src, text)
    raw = text.encode("utf-8")
    stats.captions += 1
    stats.with_bang += "!" in text
    stats.over_512_bytes += len(raw) > 512
    stats.words.append(len(text.split()))
    stats.sizes.append(len(raw))
    stats.texts.append(text)


def _affix(src: CaptionSource, text: str) -> str:
    if src.prefix:
        text = src.prefix + src.joiner + text
    if src.suffix:
        text = text + src.joiner + src.suffix
    return text
