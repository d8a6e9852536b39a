"""What the shipped tiny text encoders carry about a prompt's colour, read by small probes (a diagnosis, issue 34).

    python benchmarks/base_eval/encoder_probe.py                 # seed 1: prompts no base decision was taken on
    python benchmarks/base_eval/encoder_probe.py --seed 2
    python benchmarks/base_eval/encoder_probe.py --t5 RUNS/encoders-t5c --label t5c   # another T5 (e.g. a continued one)
    python benchmarks/base_eval/encoder_probe.py --klein RUNS/encoders-klein --label klein   # the klein base's Qwen3

For each encoder, read the way a pipeline reads it (T5: Chroma's/Flux's 256-token window with its attention mask,
last hidden state, and Flux's/SD3's the same without the mask, as the encoders were trained; CLIP-L: SD 1.5's 77 tokens, penultimate layer), two probes are fitted on 3,000 training
captions of the denoisers' data (the simple world, seed 0) to name the caption's colour (7 classes):

* ``mean``: a linear read-out of the mean over the real tokens;
* ``attention``: four learned queries attending over the tokens, then a linear read-out.

They are then asked the colour of the 600 prompts of ``evalset.eval_set(200, SEED)`` (new wording; another seed than
the 600 the bases are judged on). Long prompts whose colour word is capitalised (``Cyan square alone``) are counted
apart: no training caption capitalises a colour word, and T5's tokenizer, unlike CLIP's, keeps case.

A probe that fails where a denoiser fails says the encoder's output does not carry the colour in a form a small
read-out finds; a probe that succeeds where the denoiser fails puts the loss in the denoiser. Beside the probes, the
same prompts' reads by a candidate base scored with ``base_eval.py score --seed`` are summarised the same way (from
``base_eval/diagnostic/*-seedS.jsonl``). Writes ``base_eval/diagnostic/encoder-probe-seedS.json``; with ``--t5``
(another encoder set's T5, read as Chroma reads it) ``encoder-probe-seedS-LABEL.json``.

With ``--klein`` (a klein encoder set, ``world_build.py klein-encoder``) the Qwen3 is read as ``Flux2KleinPipeline``
reads it (the caption in its chat template, thinking off, 512 tokens padded on the right, the mask into the encoder)
at the official taps (9, 18, 27) stacked per token and, beside them, at the deviating taps (10, 20, 30); the result
also holds each official tap's mean cosine similarity to its deviating one over the prompts' real tokens. The klein
plan's encoder gate (benchmarks/klein/bench_klein.md decision 4) reads the better probe of the official taps.

With ``--klein ... --diagnose`` (bench_effects.md amendment 13's diagnosis) the same probes name the prompt's colour
**and its position** (9 classes) from three tap sets: the official taps, the deviating taps and the encoder's final
normed output (``hidden_states[-1]``, where its training read-outs sit). Written as
``encoder-probe-seedS-LABEL-diagnosis.json``; it decides nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "base_eval" / "diagnostic"
COLOURS = ("red", "orange", "yellow", "green", "cyan", "blue", "purple")
N_TRAIN = 3000
STEPS = 300
BATCH = 256


def group(text: str, style: str, colour: str) -> str:
    """The prompt's style, with ``-capitalised`` when its colour word is written with a capital."""
    return style + ("-capitalised" if re.search(r"\b" + colour.capitalize() + r"\b", text) else "")


def _colour_of(caption: str) -> int:
    for k, word in enumerate(COLOURS):
        if re.search(r"\b" + word + r"\b", caption):
            return k
    return -1


def _encode(tokenizer: Any, encoder: Any, texts: list[str], length: int, layer: int, masked: bool) -> tuple[Any, Any]:
    import torch

    hs, ms = [], []
    for i in range(0, len(texts), 64):
        tok = tokenizer(texts[i : i + 64], padding="max_length", max_length=length, truncation=True,
                        return_tensors="pt")  # fmt: skip
        with torch.no_grad():
            out = encoder(tok.input_ids, attention_mask=tok.attention_mask if masked else None,
                          output_hidden_states=True)  # fmt: skip
        hs.append(out.hidden_states[layer])
        ms.append(tok.attention_mask)
    return torch.cat(hs), torch.cat(ms)


def _probes(width: int, classes: int = len(COLOURS)) -> dict[str, Any]:
    import torch

    class Mean(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = torch.nn.Linear(width, classes)

        def forward(self, h: Any, m: Any) -> Any:
            m = m[..., None].to(h.dtype)
            return self.out((h * m).sum(1) / m.sum(1))

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.queries = torch.nn.Parameter(torch.randn(4, width) * 0.1)
            self.keys = torch.nn.Linear(width, width)
            self.out = torch.nn.Linear(4 * width, classes)

        def forward(self, h: Any, m: Any) -> Any:
            scores = (self.keys(h) @ self.queries.T) / width**0.5
            weights = scores.masked_fill(m[..., None] == 0, -1e9).softmax(1)
            return self.out((weights.transpose(1, 2) @ h).flatten(1))

    return {"mean": Mean, "attention": Attention}


#: Flux2KleinPipeline's taps (the profile's) and the diffusers klein training script's default (the layers row).
KLEIN_TAPS = {"official (9, 18, 27)": (9, 18, 27), "deviating (10, 20, 30)": (10, 20, 30)}


def _encode_klein(encoder: Any, texts: list[str], pairs: Any = (),
                  taps: dict[str, tuple[int, ...]] = KLEIN_TAPS) -> tuple[dict[str, Any], Any, list[Any]]:
    """The prompts as the klein pipeline encodes them, in one encoder pass: per tap set of :data:`KLEIN_TAPS` the
    stacked taps (N, 512, 3 x width), the mask, and per pair of layers ``(a, b)`` in ``pairs`` the cosine
    similarities of their states at the real tokens."""
    import torch

    from te_align.tiny import tokenizers as tok

    tokenizer = tok.qwen3_instruct_tokenizer()
    hs: dict[str, list[Any]] = {name: [] for name in taps}
    ms, cos = [], []
    for i in range(0, len(texts), 64):
        chat = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=False)
                for t in texts[i : i + 64]]  # fmt: skip
        enc = tokenizer(chat, padding="max_length", max_length=512, truncation=True, return_tensors="pt")
        with torch.no_grad():
            out = encoder(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_hidden_states=True,
                          use_cache=False)  # fmt: skip
        for name, layers in taps.items():
            hs[name].append(torch.cat([out.hidden_states[k] for k in layers], dim=-1))
        ms.append(enc.attention_mask)
        real = enc.attention_mask.bool()
        cos.append([torch.nn.functional.cosine_similarity(out.hidden_states[a][real], out.hidden_states[b][real], dim=-1)
                    for a, b in pairs])  # fmt: skip
    return ({name: torch.cat(h) for name, h in hs.items()}, torch.cat(ms),
            [torch.cat([batch[k] for batch in cos]) for k in range(len(pairs))])  # fmt: skip


def _fit(cls: Any, h_tr: Any, m_tr: Any, y_tr: Any) -> Any:
    import torch

    torch.manual_seed(0)
    model = cls()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        idx = torch.randint(0, len(y_tr), (BATCH,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(h_tr[idx], m_tr[idx]), y_tr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _read(h_tr: Any, m_tr: Any, y_tr: Any, h_ev: Any, m_ev: Any, y_ev: Any,
          classes: int = len(COLOURS)) -> dict[str, tuple[float, list[bool]]]:
    """Per probe kind: its accuracy on the training captions and whether it names each prompt's colour."""
    import torch

    out = {}
    for kind, cls in _probes(h_tr.shape[-1], classes).items():
        model = _fit(cls, h_tr, m_tr, y_tr)
        with torch.no_grad():
            out[kind] = (float((model(h_tr, m_tr).argmax(1) == y_tr).float().mean()),
                         (model(h_ev, m_ev).argmax(1) == y_ev).tolist())  # fmt: skip
    return out


def _training_samples() -> list[Any]:
    """The probes' training data: the first :data:`N_TRAIN` scenes of the denoisers' data (the simple world, seed 0,
    pink held out; a dataset's first scenes do not depend on its size)."""
    from te_align.tiny import world

    pink = world.Concept("colour", "pink")
    return world.make_dataset(N_TRAIN, 0, image_size=None, tokenizer=False, split="base", concept=pink,
                              space=world.SPACES["simple"])  # fmt: skip


def _training_captions() -> list[tuple[str, int]]:
    train = [(s.caption, _colour_of(s.caption)) for s in _training_samples()]
    return [(c, y) for c, y in train if y >= 0]


def _klein_encoder(folder: Path) -> Any:
    """The Qwen3 of a klein encoder set, float32, frozen."""
    import transformers

    return transformers.Qwen3ForCausalLM.from_pretrained(str(folder / "qwen3")).float().eval().requires_grad_(False)


def probe_klein(seed: int, folder: Path) -> dict[str, Any]:
    """The klein encoder's colour read-outs at the official and deviating taps (module doc), with the gate's verdict."""
    import torch

    from te_align.tiny.world import evalset

    torch.set_num_threads(1)
    encoder = _klein_encoder(folder)
    train = _training_captions()
    prompts = evalset.eval_set(200, seed)
    groups = [group(p.text, p.style, p.colour) for p in prompts]
    y_tr = torch.tensor([y for _, y in train])
    y_ev = torch.tensor([COLOURS.index(p.colour) for p in prompts])
    result: dict[str, Any] = {"seed": seed, "encoder": folder.name, "train_captions": len(train), "prompts": len(prompts),
                              "taps": {}}  # fmt: skip
    pairs = tuple(zip(*KLEIN_TAPS.values(), strict=True))
    train_h, m_tr, _ = _encode_klein(encoder, [c for c, _ in train])
    eval_h, m_ev, cos = _encode_klein(encoder, [p.text for p in prompts], pairs)
    for name in KLEIN_TAPS:
        result["taps"][name] = {kind: {"train": round(acc, 4), "correct": sum(hit), **_tally(groups, hit)}
                                for kind, (acc, hit) in _read(train_h[name], m_tr, y_tr, eval_h[name], m_ev, y_ev).items()}  # fmt: skip
    similarity = {f"{a} vs {b}": round(float(c.mean()), 4) for (a, b), c in zip(pairs, cos, strict=True)}
    result["cosine_official_vs_deviating"] = similarity
    best = max(v["correct"] for v in result["taps"]["official (9, 18, 27)"].values())
    result["gate"] = {"rule": "the better probe of the official taps reads >= 95.0% of the prompts' colours",
                      "best_correct": best, "of": len(prompts), "passed": best >= 0.95 * len(prompts)}  # fmt: skip
    return result


#: The diagnosis's tap sets: the gate's two and the encoder's final normed output (its training read-outs' input).
DIAGNOSIS_TAPS = {**KLEIN_TAPS, "final output (31)": (31,)}


def diagnose_klein(seed: int, folder: Path) -> dict[str, Any]:
    """Colour and position read-outs of the klein encoder at :data:`DIAGNOSIS_TAPS` (module doc); decides nothing."""
    import torch

    from te_align.tiny.world import evalset
    from te_align.tiny.world.scenes import POSITIONS

    torch.set_num_threads(1)
    encoder = _klein_encoder(folder)
    data = [s for s in _training_samples() if len(s.objects) == 1]
    prompts = evalset.eval_set(200, seed)
    groups = [group(p.text, p.style, p.colour) for p in prompts]
    labels = {
        "colour": ([COLOURS.index(s.objects[0].colour) for s in data], [COLOURS.index(p.colour) for p in prompts]),
        "position": ([POSITIONS.index(s.objects[0].position) for s in data], [POSITIONS.index(p.position) for p in prompts]),
    }
    train_h, m_tr, _ = _encode_klein(encoder, [s.caption for s in data], taps=DIAGNOSIS_TAPS)
    eval_h, m_ev, _ = _encode_klein(encoder, [p.text for p in prompts], taps=DIAGNOSIS_TAPS)
    result: dict[str, Any] = {"seed": seed, "encoder": folder.name, "train_captions": len(data), "prompts": len(prompts),
                              "decides": "nothing (a diagnosis)", "read": {}}  # fmt: skip
    for attribute, (y_tr, y_ev) in labels.items():
        classes = len(POSITIONS) if attribute == "position" else len(COLOURS)
        for name in DIAGNOSIS_TAPS:
            read = _read(train_h[name], m_tr, torch.tensor(y_tr), eval_h[name], m_ev, torch.tensor(y_ev), classes)
            result["read"].setdefault(attribute, {})[name] = {
                kind: {"train": round(acc, 4), "correct": sum(hit), **_tally(groups, hit)} for kind, (acc, hit) in read.items()
            }
    return result


def probe(seed: int, t5: Path | None = None) -> dict[str, Any]:
    import torch

    from te_align.tiny import world
    from te_align.tiny.world import evalset

    torch.set_num_threads(1)
    train = _training_captions()
    prompts = evalset.eval_set(200, seed)
    groups = [group(p.text, p.style, p.colour) for p in prompts]
    flux, sd15 = world.base("flux"), world.base("sd15")
    readers = {
        "t5 (chroma: 256 tokens, mask, last layer)": (flux.tokenizer_2, flux.text_encoder_2, 256, -1, True),
        "t5 (flux, sd3: 256 tokens, no mask, last layer)": (flux.tokenizer_2, flux.text_encoder_2, 256, -1, False),
        "clip-l (sd 1.5: 77 tokens, penultimate layer)": (sd15.tokenizer, sd15.text_encoder, 77, -2, False),
    }
    if t5 is not None:
        import transformers

        other = transformers.T5EncoderModel.from_pretrained(str(t5 / "t5")).float().eval().requires_grad_(False)
        readers = {f"t5 of {t5.name} (chroma: 256 tokens, mask, last layer)": (flux.tokenizer_2, other, 256, -1, True)}
    result: dict[str, Any] = {"seed": seed, "train_captions": len(train), "prompts": len(prompts), "encoders": {}}
    for name, (tok, enc, length, layer, masked) in readers.items():
        h_tr, m_tr = _encode(tok, enc, [c for c, _ in train], length, layer, masked)
        h_ev, m_ev = _encode(tok, enc, [p.text for p in prompts], length, layer, masked)
        y_tr = torch.tensor([y for _, y in train])
        y_ev = torch.tensor([COLOURS.index(p.colour) for p in prompts])
        result["encoders"][name] = {kind: {"train": round(acc, 4), **_tally(groups, hit)}
                                    for kind, (acc, hit) in _read(h_tr, m_tr, y_tr, h_ev, m_ev, y_ev).items()}  # fmt: skip
    result["denoisers"] = {}
    for path in sorted(OUT.glob(f"*-seed{seed}.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        hit = [any(r[0] == row["colour"] for r in row["read"]) for row in rows]
        result["denoisers"][path.stem] = _tally([group(r["text"], r["style"], r["colour"]) for r in rows], hit)
    return result


def _tally(groups: list[str], hit: list[bool]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for g, h in zip(groups, hit, strict=True):
        k, n = out.get(g, [0, 0])
        out[g] = [k + int(h), n + 1]
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--t5", type=Path, default=None, help="an encoder set (world_build.py encoders OUT) whose T5 to probe")
    ap.add_argument("--klein", type=Path, default=None, help="a klein encoder set (world_build.py klein-encoder OUT)")
    ap.add_argument("--label", default="", help="with --t5 or --klein: the result's name")
    ap.add_argument("--diagnose", action="store_true", help="with --klein: colour and position at three tap sets")
    args = ap.parse_args(argv)
    if args.klein is not None and not (args.label and (args.klein / "qwen3" / "config.json").is_file()):
        ap.error("--klein needs --label and a folder with qwen3/config.json")
    if args.t5 is not None and not (args.label and (args.t5 / "t5" / "model.safetensors").is_file()):
        ap.error("--t5 needs --label and a folder with t5/model.safetensors")
    if args.seed == 0:
        ap.error("seed 0 is the prompt set the bases are judged on; a diagnosis uses another")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.diagnose and args.klein is None:
        ap.error("--diagnose needs --klein")
    if args.diagnose:
        result = diagnose_klein(args.seed, args.klein)
    else:
        result = probe_klein(args.seed, args.klein) if args.klein is not None else probe(args.seed, args.t5)
    OUT.mkdir(parents=True, exist_ok=True)
    labelled = args.t5 is not None or args.klein is not None
    name = f"encoder-probe-seed{args.seed}" + (f"-{args.label}" if labelled else "") + ("-diagnosis" if args.diagnose else "")
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
