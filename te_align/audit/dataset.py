"""``check --dataset``: the token lengths of the user's own captions, per encoder slot of the profile, counted with
the profile's real tokenizers after the trainer's caption handling and the slot's template, and how many captions
the trainer's length and the official one cut.

Tokenizers come from ``--tokenizer-dir``, the model paths the config names (a diffusers folder with ``tokenizer/``,
``tokenizer_2/`` …, or a hub repo id), then the Hugging Face hub cache (``HF_HUB_CACHE`` / ``HF_HOME``, read from its
folder layout, nothing fetched). ``transformers`` (or ``tokenizers`` alone, for a ``tokenizer.json``) is imported
only here, and this module only when ``--dataset`` asks for it: a plain ``check`` stays torch- and
transformers-free. Where a slot's tokenizer is not found the slot says in one line what is needed, and the byte/word
bounds of :mod:`te_align.audit.captions` still hold.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align.encoding.text import render

if TYPE_CHECKING:  # pragma: no cover
    from te_align.audit.captions import CaptionStats
    from te_align.audit.findings import Finding
    from te_align.audit.parsed import CaptionSource
    from te_align.profiles import AlignmentProfile
    from te_align.profiles.model import SlotSpec, TokenizerSpec

#: Files one of which a tokenizer folder holds (besides tokenizer_config.json).
VOCAB_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer.model", "tekken.json")
#: Captions per batch handed to the fast tokenizer (the progress bar moves per batch).
BATCH = 1000


@dataclass
class SlotLengths:
    """One encoder slot's token lengths over the dataset."""

    slot: str
    tokenizer_cls: str
    #: Where the tokenizer was loaded from ("" when it was not found: ``missing`` says what is needed).
    tokenizer: str = ""
    missing: str = ""
    #: Tokens the encoder keeps per caption (template and special tokens included, the dropped template prefix not),
    #: with the trainer's caption handling and template; and with the profile's template where it differs.
    counts: list[int] = field(default_factory=list)
    official_counts: list[int] = field(default_factory=list)
    trainer_length: int = 0
    official_length: int = 0
    #: Whether the padding up to the length reaches what the model sees (an unmasked bidirectional encoder, or the
    #: hidden states reach the denoiser without a mask): then a length that cuts nothing still changes the input.
    padding_seen: bool = False
    template: str = "{prompt}"
    #: Where the tokenizer was looked for, in order (the ``--json`` output's ``looked_in`` when it was not found).
    looked: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, int]:
        return distribution(self.counts)

    def longer(self, length: int, official: bool = False) -> int:
        counts = (self.official_counts or self.counts) if official else self.counts
        return sum(n > length for n in counts)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"slot": self.slot, "tokenizer_cls": self.tokenizer_cls, "tokenizer": self.tokenizer,
                                "trainer_length": self.trainer_length, "official_length": self.official_length}
        if self.missing:
            d["missing"] = self.missing
            d["looked_in"] = list(self.looked)
            return d
        d["tokens"] = self.stats()
        if self.official_counts:
            d["tokens_with_profile_template"] = distribution(self.official_counts)
        d["longer_than_trainer_length"] = self.longer(self.trainer_length)
        d["longer_than_official_length"] = self.longer(self.official_length, official=True)
        d["padding_seen"] = self.padding_seen
        return d


def distribution(counts: Sequence[int]) -> dict[str, int]:
    """min, median, p90, p99, max by the nearest-rank method (each an observed count)."""
    if not counts:
        return {}
    s = sorted(counts)

    def rank(p: float) -> int:
        return s[max(0, math.ceil(p / 100 * len(s)) - 1)]

    return {"min": s[0], "median": rank(50), "p90": rank(90), "p99": rank(99), "max": s[-1]}


# ---- where a tokenizer is ------------------------------------------------------------------------------------

def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` finds it (HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo: str) -> Path | None:
    """The cached snapshot of a model repo: the one ``refs/main`` names, else the newest; None when none is cached."""
    if repo.count("/") != 1:
        return None
    base = hub_cache() / ("models--" + repo.replace("/", "--"))
    snaps = base / "snapshots"
    if not snaps.is_dir():
        return None
    ref = base / "refs" / "main"
    if ref.is_file():
        named = snaps / ref.read_text(encoding="utf-8").strip()
        if named.is_dir():
            return named
    found = sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / f).is_file() for f in VOCAB_FILES)


def _base(cls: str) -> str:
    return cls[:-4] if cls.endswith("Fast") else cls


def _class_matches(folder: Path, spec: TokenizerSpec) -> bool:
    """A tokenizer folder given directly (not as a model folder): its tokenizer_config's class is the slot's, and so
    is its pad token where both name one (CLIP-L pads with <|endoftext|>, CLIP-G with "!")."""
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict):
        return False
    named = cfg.get("tokenizer_class")
    if not (isinstance(named, str) and _base(named) == _base(spec.cls)):
        return False
    pad = cfg.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    return not (isinstance(pad, str) and spec.pad_token is not None and pad != spec.pad_token)


def find_tokenizer(slot: SlotSpec, prof: AlignmentProfile, model_paths: Sequence[str],
                   tokenizer_dirs: Sequence[str],
                   tokenizer_paths: Sequence[str] = ()) -> tuple[Path | None, list[str]]:
    """The folder of a slot's tokenizer and the places looked in (in order): each ``--tokenizer-dir`` (its
    ``<subfolder>/``, or itself when its tokenizer class and pad token are the slot's), where the trainer loads this
    slot's tokenizer from (``tokenizer_paths``: folders or hub repo ids, the same test), each model path of the
    config (a folder's ``<subfolder>/``, a hub repo id's cached snapshot's), then the profile's repo in the hub cache."""
    sub = slot.tokenizer_subfolder
    looked: list[str] = []

    def folder_of(base: Path, itself: bool) -> Path | None:
        looked.append(str(base / sub))
        if _has_tokenizer(base / sub):
            return base / sub
        if itself and _has_tokenizer(base) and _class_matches(base, slot.tokenizer):
            return base
        return None

    def resolve(m: str, itself: bool) -> Path | None:
        p = Path(m).expanduser()
        if p.is_dir():
            return folder_of(p, itself)
        if not p.exists() and m.count("/") == 1 and not m.startswith((".", "/", "~")):
            snap = hub_snapshot(m)
            if snap is None:
                looked.append(f"{m} in the hub cache")
                return None
            return folder_of(snap, itself)
        # a checkpoint file holds no tokenizer: the trainer's or the profile repo's is looked for
        looked.append(f"{m} ({'a file' if p.exists() else 'not here'})")
        return None

    for d in tokenizer_dirs:
        hit = folder_of(Path(d), True)
        if hit is not None:
            return hit, looked
    for m in [*tokenizer_paths, *model_paths]:
        hit = resolve(m, m in tokenizer_paths)
        if hit is not None:
            return hit, looked
    hit = resolve(prof.repo, False)
    if hit is not None:
        return hit, looked
    looked.append(f"(hub cache: {hub_cache()})")
    return None, looked


def missing_line(slot: SlotSpec, prof: AlignmentProfile) -> str:
    """What a slot needs when its tokenizer is not found, in one line."""
    sub = slot.tokenizer_subfolder
    return (f"{slot.name} tokenizer ({slot.tokenizer.cls}) not found: pass --tokenizer-dir DIR (a model folder with "
            f"{sub}/, or the tokenizer's own folder) or download {prof.repo}'s {sub}/ "
            f"(huggingface-cli download {prof.repo} --include '{sub}/*')")


# ---- counting ------------------------------------------------------------------------------------------------

Counter = Callable[[list[str]], list[int]]


def load_counter(folder: Path, spec: TokenizerSpec) -> Counter:
    """A function giving each text's token count (with the slot's special tokens) by the tokenizer in ``folder``,
    through the fast (Rust) tokenizer's batch encode: ``tokenizers`` on the folder's tokenizer.json where it has one
    (the serialized fast tokenizer transformers loads; no transformers import), else transformers' class of the slot
    (which converts vocab.json/merges.txt or spiece.model). Raises ImportError naming what is missing."""
    backend: Any = None
    if (folder / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            Tokenizer = None  # type: ignore[assignment,misc]
        if Tokenizer is not None:
            backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if backend is None:
        try:
            import transformers
        except ImportError as e:
            if (folder / "tokenizer.json").is_file():
                raise ImportError("counting tokens needs the tokenizers package (pip install tokenizers)") from e
            raise ImportError("counting tokens needs transformers (pip install transformers): the folder has no "
                              "tokenizer.json that the tokenizers package could read alone") from e
        cls = (getattr(transformers, _base(spec.cls) + "Fast", None) or getattr(transformers, spec.cls, None)
               or transformers.AutoTokenizer)
        tok = cls.from_pretrained(str(folder))
        backend = getattr(tok, "_tokenizer", None)
        if backend is None:  # a Python tokenizer: transformers' own batch call
            def slow(texts: list[str]) -> list[int]:
                ids = tok(texts, add_special_tokens=spec.add_special_tokens)["input_ids"]
                return [len(x) for x in ids]
            return slow

    def fast(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=spec.add_special_tokens)]
    return fast


class Progress:
    """A one-line progress count on stderr, shown only on a terminal and only once the work has taken over ~1 s."""

    def __init__(self, total: int, label: str, stream: Any = None) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.shown = False
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, done: int) -> None:
        if not self.tty or time.monotonic() - self.start < 1.0:
            return
        self.shown = True
        width = 30
        filled = width * done // max(self.total, 1)
        self.stream.write(f"\r  {self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * (len(self.label) + 50) + "\r")
            self.stream.flush()


def count(counter: Counter, texts: list[str], label: str) -> list[int]:
    """Token counts of ``texts`` in batches, with a progress bar over large datasets."""
    bar = Progress(len(texts), label)
    out: list[int] = []
    for i in range(0, len(texts), BATCH):
        out += counter(texts[i:i + BATCH])
        bar.update(len(out))
    bar.close()
    return out


def _spec_with(spec: TokenizerSpec, slot: str, effective: dict[str, object],
               template_of: dict[str, str] | None = None) -> TokenizerSpec:
    """The slot's tokenizer spec with the trainer's template, system prompt and dropped prefix, where the check read
    them (its effective values, or the reader's ``templates``)."""
    changes: dict[str, Any] = {}
    template = (template_of or {}).get(slot, effective.get(f"{slot}.tokenizer.template"))
    if isinstance(template, str):
        changes["template"] = template
    if f"{slot}.tokenizer.system_prompt" in effective:  # None: the trainer adds no system prompt
        v = effective[f"{slot}.tokenizer.system_prompt"]
        if v is None or isinstance(v, str):
            changes["system_prompt"] = v
    drop = effective.get(f"{slot}.tokenizer.drop_start_tokens")
    if isinstance(drop, int) and not isinstance(drop, bool):
        changes["drop_start_tokens"] = drop
    return dataclasses.replace(spec, **changes) if changes else spec


def padding_seen(prof: AlignmentProfile, slot: SlotSpec) -> bool:
    """Whether padding up to a fixed length reaches what the model sees: the profile pads to a fixed length and
    either a bidirectional (T5-style) encoder attends to it unmasked, or the slot's hidden states reach the denoiser
    without a mask (its positions are attended)."""
    if slot.tokenizer.padding != "max_length":
        return False
    bidirectional = "T5" in slot.encoder.cls
    if (bidirectional or slot.tokenizer.padding_side == "left") and not slot.masks.encoder:
        return True
    hidden_used = any(f"{slot.name}.hidden" in expr for _, expr in prof.outputs)
    return hidden_used and not slot.masks.denoiser


def measure(stats: CaptionStats, prof: AlignmentProfile, effective: dict[str, object], model_paths: Sequence[str],
            tokenizer_dirs: Sequence[str], tokenizer_paths: dict[str, list[str]] | None = None,
            templates: dict[str, str] | None = None) -> list[SlotLengths]:
    """Per slot of the profile: the token counts of the captions (``stats.texts``) with the trainer's handling,
    or the one line saying which tokenizer is missing. Fills ``stats.tokens`` for the severity policy."""
    out: list[SlotLengths] = []
    loaded: dict[tuple[str, str], Counter] = {}
    for slot in prof.slots:
        spec = slot.tokenizer
        eff = _spec_with(spec, slot.name, effective, templates)
        trainer_length = effective.get(f"{slot.name}.tokenizer.max_length", spec.max_length)
        if not isinstance(trainer_length, int) or isinstance(trainer_length, bool):
            trainer_length = spec.max_length
        rep = SlotLengths(slot=slot.name, tokenizer_cls=spec.cls, trainer_length=trainer_length,
                          official_length=spec.max_length, padding_seen=padding_seen(prof, slot),
                          template=eff.template)
        out.append(rep)
        folder, rep.looked = find_tokenizer(slot, prof, model_paths, tokenizer_dirs,
                                            (tokenizer_paths or {}).get(slot.name, ()))
        if folder is None:
            rep.missing = missing_line(slot, prof)
            continue
        key = (str(folder), spec.cls)
        try:
            counter = loaded.get(key) or load_counter(folder, spec)
        except ImportError as e:
            rep.missing = f"{slot.name} tokenizer at {folder}: {e}"
            continue
        except Exception as e:  # a tokenizer folder that does not load: one line naming it
            rep.missing = f"{slot.name} tokenizer at {folder} does not load ({type(e).__name__}: {str(e)[:120]})"
            continue
        loaded[key] = counter
        rep.tokenizer = str(folder)
        texts = [render(eff, t) for t in stats.texts]
        rep.counts = [n - eff.drop_start_tokens for n in count(counter, texts, f"{slot.name} tokens")]
        official = [render(spec, t) for t in stats.texts]
        if official != texts or eff.drop_start_tokens != spec.drop_start_tokens:
            rep.official_counts = [n - spec.drop_start_tokens for n in count(counter, official, f"{slot.name} tokens")]
            stats.official_tokens[slot.name] = rep.official_counts
        stats.tokens[slot.name] = rep.counts
        if rep.padding_seen:
            stats.padding_seen.add(slot.name)
    return out


def describe(rep: SlotLengths, captions: int) -> list[str]:
    """The report lines of one slot."""
    if rep.missing:
        return [rep.missing]
    d = rep.stats()
    head = (f"{rep.slot} ({rep.tokenizer_cls}, {rep.tokenizer}): tokens per caption min {d['min']} · median "
            f"{d['median']} · p90 {d['p90']} · p99 {d['p99']} · max {d['max']}")
    lines = [head]
    if rep.official_counts:
        o = distribution(rep.official_counts)
        lines.append(f"  with the profile's template: min {o['min']} · median {o['median']} · p90 {o['p90']} · p99 "
                     f"{o['p99']} · max {o['max']}")
    lengths = [(rep.trainer_length, "the trainer's length", False)]
    if rep.official_length != rep.trainer_length or rep.official_counts:
        lengths.append((rep.official_length, "the official length", True))
    else:
        lengths[0] = (rep.trainer_length, "the trainer's and the official length", False)
    for length, which, official in lengths:
        n = rep.longer(length, official=official)
        if n:
            lines.append(f"  at {length} ({which}): {n} of {captions} captions ({_pct(n, captions)}) lose tokens "
                         f"past {length}")
        else:
            none_cut = not any(rep.longer(x, official=o) for x, _, o in lengths)
            tail = "; only padding differs" if (rep.official_length != rep.trainer_length and none_cut
                                                and not official) else ""
            lines.append(f"  at {length} ({which}): 0 of {captions} captions are longer{tail}")
    return lines


def _pct(n: int, total: int) -> str:
    p = 100 * n / total
    return f"{p:.0f}%" if p >= 1 or n == 0 else f"{p:.1f}%"


# ---- the report ----------------------------------------------------------------------------------------------

def sources(given: list[str], named: Sequence[CaptionSource], named_dirs: Sequence[str]) -> tuple[list[CaptionSource], str]:
    """The caption sources to read and, when there is none, the one line saying why: the ``--dataset`` folders
    (each with the trainer's handling where the config names the same folder), else the folders the config names."""
    from te_align.audit.parsed import CaptionSource

    known = list(named) + [CaptionSource(folder=str(d)) for d in named_dirs
                           if str(d) not in {s.folder for s in named}]
    skipped = [s for s in known if s.skip]
    if given:
        def same(a: str, b: str) -> bool:
            try:
                return Path(a).resolve() == Path(b).resolve()
            except OSError:
                return False
        out = [next((s for s in known if same(s.folder, d)), None) or CaptionSource(folder=d) for d in given]
        return out, ""
    if not known:
        return [], "the config names no dataset; pass --dataset DIR"
    if skipped and len(skipped) == len(known):
        return [], "; ".join(f"{s.folder}: {s.skip}" for s in skipped) + "; pass --dataset DIR to count caption files"
    here = [s for s in known if Path(s.folder).is_dir()]
    if not here:
        gone = ", ".join(dict.fromkeys(s.folder for s in known))
        return [], f"the config names {gone}, which is not here; pass --dataset DIR"
    return here, ""


def handling(src: CaptionSource) -> str:
    """A source's caption handling in words."""
    parts = [f"{src.extension if src.extension else '.txt/.caption'} files"]
    if not src.recursive:
        parts.append("this folder only (no sub-folders)")
    if src.first_line:
        parts.append("first line only")
    if not src.strip:
        parts.append("kept as written (not stripped)")
    if src.rejoin is not None:
        parts.append(f"split at {json.dumps(src.rejoin[0])}" + (", each tag stripped," if src.rejoin_strip else "")
                     + (" empty tags dropped," if src.rejoin_drop_empty else "")
                     + f" and joined with {json.dumps(src.rejoin[1])}" + (" (prefix and suffix included)"
                                                                         if src.affix_first else ""))
    if src.trigger:
        parts.append(f"trigger word {json.dumps(src.trigger, ensure_ascii=False)} (for [trigger]/[name], else put "
                     "first)")
    if src.prefix:
        parts.append(f"prefix {json.dumps(src.prefix, ensure_ascii=False)}")
    if src.suffix:
        parts.append(f"suffix {json.dumps(src.suffix, ensure_ascii=False)}")
    if src.each_line:
        parts.append("each line a caption")
    parts += [f"{x} (keeps the length)" for x in src.length_invariant]
    return ", ".join(parts) + (f" [{src.source}]" if src.source else "")


def report(stats: CaptionStats | None, missing: str, prof: AlignmentProfile, effective: dict[str, object],
           model_paths: Sequence[str], tokenizer_dirs: Sequence[str],
           srcs: Sequence[CaptionSource] = (), tokenizer_paths: dict[str, list[str]] | None = None,
           templates: dict[str, str] | None = None) -> dict[str, object]:
    """``result.dataset``: the captions read, per slot their token lengths (or what is missing), and the report
    lines (``lines``) ``check`` prints."""
    if stats is None or not stats.captions:
        why = missing or (f"no caption files in {', '.join(stats.folders)}" if stats is not None else
                          "no caption folder")
        return {"captions": 0, "note": why, "lines": [f"dataset: {why}"]}
    slots = measure(stats, prof, effective, model_paths, tokenizer_dirs, tokenizer_paths, templates)
    where = ", ".join(stats.folders)
    partial = f" ({len(stats.undecodable)} not UTF-8, left out: a partial verdict)" if stats.undecodable else ""
    lines = [f"dataset: {stats.captions} captions in {where}{' (first files only)' if stats.truncated else ''}"
             f"{partial}"]
    lines += [f"  caption handling: {handling(s)}" for s in srcs if s.folder in stats.folders]
    lines += [f"  not read: {s.folder}: {s.skip}" for s in srcs if s.skip]
    for rep in slots:
        lines += ["  " + x for x in describe(rep, stats.captions)]
        if rep.template != "{prompt}" and not rep.missing:
            lines.append("    (the slot's template and special tokens are counted; a dropped template prefix is not)")
        if rep.missing:
            pairs = [(rep.trainer_length, "the trainer's"), (rep.official_length, "the official")]
            if rep.trainer_length == rep.official_length:
                pairs = [(rep.trainer_length, "the trainer's and the official")]
            for length, which in pairs:
                certain, maybe = stats.cut_at(length)
                lines.append(f"    byte/word bounds at {length} ({which} length): {certain} of {stats.captions} captions "
                             f"certainly longer (more words), {maybe} may be (more bytes)")
    return {
        "captions": stats.captions,
        "folders": list(stats.folders),
        "truncated": stats.truncated,
        "handling": [handling(s) for s in srcs if s.folder in stats.folders],
        "undecodable": [{"file": f, "why": w} for f, w in stats.undecodable],
        "slots": [r.to_dict() for r in slots],
        "lines": lines,
    }


def unreadable_findings(stats: CaptionStats | None) -> list[Finding]:
    """One finding for the caption files that are not UTF-8: the first named, the others counted."""
    from te_align.audit.findings import Finding

    if stats is None or not stats.undecodable:
        return []
    path, why = stats.undecodable[0]
    rest = len(stats.undecodable) - 1
    return [Finding(kind="wrong-value", severity="error", setting="dataset", message=(
        f"{path}: {why}, in a caption file" + (f"; {rest} other caption file(s) not UTF-8 either, skipped" if rest
                                               else "")
        + f"; the dataset figures are on the other {stats.captions} caption(s), a partial verdict"),
        fix="save the caption files as UTF-8 text")]
