"""``te-align matrix --inference``: what the denoiser gets in each inference tool, against ``te_align.encode``.

Per family and profile, over the standard prompt suite (:func:`te_align.probe.core.prompt_suite`, one prompt at a
time as the tools encode them):

* **diffusers pipeline** — the pipeline's own ``encode_prompt`` with its defaults, on te-align's tiny components;
* **ComfyUI stock** — ComfyUI's ``CLIPTextEncode`` node (from a checkout) on ComfyUI's text-encoder objects with
  tiny weights and ComfyUI's shipped tokenizers;
* **ComfyUI + te-align node** — the "te-align Text Encode" node on the same objects;
* **Forge** — its text-processing engines when they import here (else the reason).

The ComfyUI rows compare with ``te_align.encode`` run on ComfyUI's own encoder modules (same weights, same kernels),
so "identical" means bit-identical; a last row gives the floor between ComfyUI's encoder implementations and
transformers' on the same weights (float rounding, not conditioning).
"""

from __future__ import annotations

import inspect
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from te_align._version import __version__
from te_align.encoding import encode
from te_align.errors import TeAlignError
from te_align.integrations import forge
from te_align.integrations.comfyui import tiny
from te_align.integrations.comfyui.encode import components, to_conditioning
from te_align.integrations.comfyui.install import comfyui_version
from te_align.integrations.comfyui.nodes import TeAlignTextEncode
from te_align.probe.core import prompt_suite
from te_align.profiles import profile as _profile
from te_align.tiny.fit import fit_profile

# Function-local te_align imports in this module: keep torch (transformers, diffusers) off this module's
# import, the CLI's cold path.


@dataclass
class Cell:
    """One tensor over the prompt suite."""

    name: str
    shapes: set[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=set)
    max_abs: float = 0.0
    cos: list[float] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)
    compared: int = 0

    #: Largest |Δ| counted as equal (0: bit-identical only); a cell with a tolerance says so.
    atol: float = 0.0
    rounding: float = 0.0

    def add(self, label: str, got: Any, ref: Any) -> None:
        import torch

        self.compared += 1
        g, r = got.detach().float().cpu()[0], ref.detach().float().cpu()[0]
        self.shapes.add((tuple(g.shape), tuple(r.shape)))
        if g.shape == r.shape and torch.equal(g, r):
            self.cos.append(1.0)
            return
        if self.atol and g.shape == r.shape and float((g - r).abs().max()) <= self.atol:
            self.rounding = max(self.rounding, float((g - r).abs().max()))
            self.cos.append(1.0)
            return
        self.differing.append(label)
        n = min(g.shape[0], r.shape[0]) if g.dim() > 1 else None
        a, b = (g[:n], r[:n]) if n is not None else (g, r)
        if a.shape == b.shape:
            self.max_abs = max(self.max_abs, float((a - b).abs().max()))
            self.cos.append(float(torch.nn.functional.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)).item()))

    def text(self) -> str:
        if not self.differing:
            return f"{self.name}: identical" + (f" within float rounding (max\\|Δ\\| {self.rounding:.1g})"
                                                 if self.rounding else "")
        shape = ""
        odd = sorted(s for s in self.shapes if s[0] != s[1])
        if odd:
            shape = "shape " + ", ".join(f"{tuple(a)} vs {tuple(b)}" for a, b in odd[:2]) + ("…" if len(odd) > 2 else "") + "; "
        cos = sum(self.cos) / len(self.cos) if self.cos else float("nan")
        rest = f"; the others within float rounding (max\\|Δ\\| {self.rounding:.1g})" if self.rounding else ""
        return (f"{self.name}: {shape}max\\|Δ\\| {self.max_abs:.3g}{' (overlap)' if odd else ''}, cos {cos:.4f}, "
                f"{len(self.differing)}/{self.compared} prompts differ ({', '.join(dict.fromkeys(self.differing))}){rest}")


def _labels(suite: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(f"{g}" if len(ps) == 1 else f"{g}[{i}]", p) for g, ps in suite.items() for i, p in enumerate(ps)]


def _row(cells: list[Cell]) -> str:
    verdict = "identical" if all(not c.differing for c in cells) else "**differs**"
    return f"{verdict} — " + "; ".join(c.text() if c.differing or c.rounding else c.name for c in cells)


def comfyui_rows(comfyui_dir: str | None) -> list[tuple[str, str, str]]:
    """(family/profile, row name, result) for the ComfyUI rows; one 'not available' row when ComfyUI does not import."""
    import torch

    try:
        tiny.import_comfyui(comfyui_dir)
        import nodes
    except (TeAlignError, ImportError) as e:
        return [("all", "ComfyUI", f"not importable here: {e}")]
    out = []
    for family, names in tiny.PROFILES.items():
        tc = tiny.build(family, comfyui_dir)
        for name in names:
            p = tiny.fitted_profile(name, tc)
            toks, encs = components(tc.clip, p)
            hf_toks, hf_encs = tiny.reference_components(p, tc)
            suite = prompt_suite(p, tc.components)
            first = p.output_names[0]
            stock = [Cell(first), Cell("pooled")] if "pooled_prompt_embeds" in p.output_names else [Cell(first)]
            node = [Cell(first), Cell("pooled")] if len(stock) == 2 else [Cell(first)]
            floor = [Cell(first)]
            for label, prompt in _labels(suite):
                with torch.no_grad():
                    ref = encode(p, [prompt], tokenizers=toks, text_encoders=encs)
                    ref_c = to_conditioning(p, ref)[0]
                    st = nodes.CLIPTextEncode().encode(tc.clip, prompt)[0][0]
                    nd = TeAlignTextEncode().encode(tc.clip, p, prompt)["result"][0][0]
                    hf = encode(p, [prompt], tokenizers=hf_toks, text_encoders=hf_encs)
                stock[0].add(label, st[0], ref[first])
                node[0].add(label, nd[0], ref_c[0])
                if len(stock) == 2:
                    stock[1].add(label, st[1]["pooled_output"], ref["pooled_prompt_embeds"])
                    node[1].add(label, nd[1]["pooled_output"], ref_c[1]["pooled_output"])
                floor[0].add(label, ref[first], hf[first])
            out.append((name, "ComfyUI stock CLIPTextEncode", _row(stock)))
            out.append((name, "ComfyUI + te-align Text Encode", _row(node)))
            out.append((name, "ComfyUI encoders vs transformers encoders, same weights (te_align.encode on each)",
                        _row(floor)))
    lumina = tiny.build("lumina2", comfyui_dir)  # ComfyUI's encoder the node refuses: its own line, as the UI shows it
    res = TeAlignTextEncode().encode(lumina.clip, "lumina2", "a photo of a cat")
    out.append(("lumina2", "ComfyUI + te-align Text Encode", f"not encoded — {res['ui']['text'][0]}"))
    return out


def diffusers_rows() -> list[tuple[str, str, str]]:
    """The diffusers pipelines' own ``encode_prompt`` (defaults) vs ``te_align.encode`` on the same components."""
    import torch

    from te_align.tiny.pipelines import build_pipeline_for_encoding

    out = []
    for family, names in (("flux", ("flux-dev", "flux-schnell")), ("sd3", ("sd35-large",)), ("sdxl", ("sdxl",)),
                          ("sd15", ("sd15",)), ("chroma", ("chroma",))):
        pipe = build_pipeline_for_encoding(family)
        for name in names:
            p = fit_profile(_profile(name), pipe)
            suite = prompt_suite(p, {s.tokenizer_subfolder: getattr(pipe, s.tokenizer_subfolder) for s in p.slots})
            first = p.output_names[0]
            cells = [Cell(first)] + ([Cell("pooled")] if "pooled_prompt_embeds" in p.output_names else [])
            for label, prompt in _labels(suite):
                with torch.no_grad():
                    ref = encode(p, [prompt], pipeline=pipe)
                    params = inspect.signature(pipe.encode_prompt).parameters
                    kw = {k: v for k, v in (("device", torch.device("cpu")), ("num_images_per_prompt", 1),
                                            ("do_classifier_free_guidance", False), ("prompt_2", None),
                                            ("prompt_3", None)) if k in params}
                    res = pipe.encode_prompt(prompt=prompt, **kw)
                got = res[0]
                cells[0].add(label, got, ref[first])
                if len(cells) == 2:
                    pooled = res[1] if family == "flux" else res[2]
                    cells[1].add(label, pooled, ref["pooled_prompt_embeds"])
            out.append((name, "diffusers pipeline, default call", _row(cells)))
    return out


def forge_rows(forge_dir: str | None) -> list[tuple[str, str, str]]:
    """Forge's own text engines (from a checkout, on the tiny diffusers components' weights) vs ``te_align.encode``
    on those components; one 'not importable' row naming what is missing when Forge does not import."""
    import torch

    try:
        forge.import_forge(forge_dir)
    except TeAlignError as e:
        return [("all", "Forge", f"not importable here: {e}")]
    out = []
    for family, names in forge.PROFILES.items():
        pipe = forge.pipeline(family)
        eng = forge.engines(family, pipe)
        for name in names:
            p = fit_profile(_profile(name), pipe)
            suite = prompt_suite(p, {s.tokenizer_subfolder: getattr(pipe, s.tokenizer_subfolder) for s in p.slots})
            first = p.output_names[0]
            pooled = "pooled_prompt_embeds" in p.output_names
            # Forge's T5 is its own code (backend/nn/t5.py): same weights, float rounding apart
            cells = [Cell(first, atol=FORGE_ATOL)] + ([Cell("pooled", atol=FORGE_ATOL)] if pooled else [])
            for label, prompt in _labels(suite):
                got = forge.conditioning(family, eng, prompt)
                with torch.no_grad():
                    ref = encode(p, [prompt], pipeline=pipe)
                cells[0].add(label, got["crossattn"], ref[first])
                if pooled:
                    cells[1].add(label, got["pooled"], ref["pooled_prompt_embeds"])
            out.append((name, "Forge text engines", _row(cells)))
    for name, why in forge.NOT_COMPARED.items():
        out.append((name, "Forge text engines", f"not compared — {why}"))
    return out


def forge_note() -> str:
    """The matrix's paragraph on how the Forge rows were made."""
    return ("Forge rows: its text engines (backend/text_processing) built with the arguments of its "
            "backend/diffusion_engine/<family>.py, on its own encoder classes holding the tiny components' weights, "
            f"compared with `te_align.encode` on those components (\"identical\" allows {FORGE_ATOL:g} of float "
            "rounding, which Forge's own T5 code may add). Stand-in: "
            + "; ".join(f"{k} ({v})" for k, v in forge.STAND_INS.items()) + ". Bridged: "
            + "; ".join(forge.BRIDGES) + ".")


#: Differences up to this are float rounding between Forge's own T5 code and transformers' on the same weights.
FORGE_ATOL = 1e-5


def inference_matrix(comfyui_dir: str | None = None, forge_dir: str | None = None) -> str:
    """The inference matrix as markdown."""
    import diffusers
    import torch
    import transformers

    comfyui_dir = comfyui_dir or os.environ.get("TE_ALIGN_COMFYUI_DIR")
    forge_dir = forge_dir or os.environ.get("TE_ALIGN_FORGE_DIR")
    rows = diffusers_rows() + comfyui_rows(comfyui_dir) + forge_rows(forge_dir)
    version = "-"
    if comfyui_dir and os.path.isfile(os.path.join(comfyui_dir, "comfyui_version.py")):
        from pathlib import Path

        version = comfyui_version(Path(comfyui_dir))
    lines = [
        "# te-align inference matrix",
        "",
        f"Measured by `te-align matrix --inference` (te-align {__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, diffusers {diffusers.__version__}, ComfyUI {version} from a checkout, "
        f"{platform.machine()}): tiny random-weight encoders, the standard prompt suite, one prompt at a time. "
        "ComfyUI rows compare with `te_align.encode` run on ComfyUI's own encoder modules (so \"identical\" is "
        "bit-identical); the diffusers row compares the pipeline's default `encode_prompt` with `te_align.encode` on "
        "the same components. Per tensor: shapes (tool vs profile), max |Δ| and mean cosine (over the overlap when "
        "shapes differ) and which prompts differ.",
        "",
    ]
    if tiny.STAND_INS:
        lines += ["Stand-ins for import dependencies that do not load here (never called by text encoding): "
                  + "; ".join(f"{k} ({v})" for k, v in tiny.STAND_INS.items()), ""]
    if forge.STAND_INS:
        lines += [forge_note(), ""]
    lines += ["| profile | tool | result |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"


__all__ = ["comfyui_rows", "diffusers_rows", "forge_rows", "inference_matrix"]
