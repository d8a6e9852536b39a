"""The diffusers example training scripts (``examples/dreambooth``, ``examples/text_to_image``): an
``accelerate launch train_*.py ARGS…`` command line, read the way the script's argparse reads it.

Every fact below was read at huggingface/diffusers@58eb52c0803ea9af3abec60841c2a093bdf1f951; ``source`` gives
file:line at that commit (paths under ``examples/``). The scripts' option names and types are bundled in
``data/diffusers-examples.txt`` of this folder (``python -m te_align.trainers.diffusers_examples.audit CHECKOUT``
regenerates it from a diffusers checkout). argparse stops at an unknown option ("unrecognized arguments"), so an
unknown flag is an error; a unique prefix of an option is accepted (argparse ``allow_abbrev``).

Scripts covered (their text paths): SD 1.x/2.x ``train_dreambooth_lora.py``, ``train_dreambooth.py``,
``train_text_to_image_lora.py``, ``train_text_to_image.py``; SDXL ``train_dreambooth_lora_sdxl.py``,
``train_text_to_image_lora_sdxl.py``, ``train_text_to_image_sdxl.py``; SD3 ``train_dreambooth_lora_sd3.py``,
``train_dreambooth_sd3.py``; FLUX.1 ``train_dreambooth_lora_flux.py``, ``train_dreambooth_flux.py``; FLUX.1 Kontext
``train_dreambooth_lora_flux_kontext.py``; FLUX.2 dev ``train_dreambooth_lora_flux2.py``,
``train_dreambooth_lora_flux2_img2img.py``; FLUX.2 klein ``train_dreambooth_lora_flux2_klein.py``,
``train_dreambooth_lora_flux2_klein_img2img.py``; Z-Image ``train_dreambooth_lora_z_image.py``; Qwen-Image
``train_dreambooth_lora_qwen_image.py``; Krea 2 ``train_dreambooth_lora_krea2.py``; Ideogram 4
``train_dreambooth_lora_ideogram4.py``. There is no LTX-2 training script at this commit.

The FLUX.2, klein, Z-Image, Qwen-Image, Krea 2 and Ideogram 4 scripts encode through the official pipeline's own ``encode_prompt``
(``text_encoding_pipeline = <Pipeline>.from_pretrained(...)``), so the recipe is the pipeline's except for what
the script passes it: ``--max_sequence_length`` and, in the FLUX.2 dev and klein (not img2img) scripts,
``--text_encoder_out_layers``, whose default [10, 20, 30] is FLUX.2 dev's layers, also in the klein script.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from te_align.audit import rules as _rules
from te_align.audit.cmdline import arg_line
from te_align.audit.findings import Finding
from te_align.audit.models import _families as bundled_families
from te_align.audit.models import assumption, community_bases, guess_model, profiles_of
from te_align.audit.parsed import (
    Parsed,
    ambiguous_finding,
    dropout_form_finding,
    reason,
    resolve_abbrev,
    unknown_key_finding,
)
from te_align.audit.parsed import script_options as parser_options
from te_align.audit.readers import RawConfig, UnreadableConfig
from te_align.audit.rules import Context, Rule, Trainer
from te_align.profiles.registry import bundled_name

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"
NAME = "diffusers-examples"

_DB = "examples/dreambooth"
_T2I = "examples/text_to_image"


@dataclass(frozen=True)
class Script:
    """One example script: where it lives, what it trains, the profile assumed when the model name tells nothing."""

    folder: str
    kind: str  # "sd" (SD 1.x/2.x), "sdxl", "sd3", "flux", "flux2", "flux2-klein", "z-image", "qwen-image", "krea2", …
    default_profile: str
    #: The script tokenizes T5 at a hard-coded length when it trains the text encoders: "custom" (only with
    #: per-image captions), "instance" (only with the one --instance_prompt), "always", or "" (never).
    te_t5_fixed: str = ""
    te_t5_length: int = 0


SCRIPTS: dict[str, Script] = {
    "train_dreambooth_lora.py": Script(_DB, "sd", "sd15"),
    "train_dreambooth.py": Script(_DB, "sd", "sd15"),
    "train_text_to_image_lora.py": Script(_T2I, "sd", "sd15"),
    "train_text_to_image.py": Script(_T2I, "sd", "sd15"),
    "train_dreambooth_lora_sdxl.py": Script(_DB, "sdxl", "sdxl"),
    "train_text_to_image_lora_sdxl.py": Script(_T2I, "sdxl", "sdxl"),
    "train_text_to_image_sdxl.py": Script(_T2I, "sdxl", "sdxl"),
    "train_dreambooth_lora_sd3.py": Script(_DB, "sd3", "sd3-medium", "custom", 77),
    "train_dreambooth_sd3.py": Script(_DB, "sd3", "sd3-medium", "always", 77),
    "train_dreambooth_lora_flux.py": Script(_DB, "flux", "flux-dev"),
    "train_dreambooth_flux.py": Script(_DB, "flux", "flux-dev", "instance", 512),
    "train_dreambooth_lora_flux_kontext.py": Script(_DB, "flux", "flux-dev"),
    "train_dreambooth_lora_flux2.py": Script(_DB, "flux2", "flux2-dev"),
    "train_dreambooth_lora_flux2_img2img.py": Script(_DB, "flux2", "flux2-dev"),
    "train_dreambooth_lora_flux2_klein.py": Script(_DB, "flux2-klein", "flux2-klein-4b"),
    "train_dreambooth_lora_flux2_klein_img2img.py": Script(_DB, "flux2-klein", "flux2-klein-4b"),
    "train_dreambooth_lora_z_image.py": Script(_DB, "z-image", "z-image"),
    "train_dreambooth_lora_qwen_image.py": Script(_DB, "qwen-image", "qwen-image"),
    "train_dreambooth_lora_krea2.py": Script(_DB, "krea2", "krea2"),
    "train_dreambooth_lora_ideogram4.py": Script(_DB, "ideogram4", "ideogram4"),
}

_FAMILIES = {"sd": ("sd1", "sd2"), "sdxl": ("sdxl",), "sd3": ("sd3",), "flux": ("flux",), "flux2": ("flux2",),
             "flux2-klein": ("flux2-klein",), "z-image": ("z-image",), "qwen-image": ("qwen-image",), "krea2": ("krea2",),
             "ideogram4": ("ideogram4",)}
SUPPORTED = ("sd1", "sd2", "sdxl", "sd3", "flux", "flux2", "flux2-klein", "z-image", "qwen-image", "krea2", "ideogram4")
#: The scripts keep no text-encoder cache on disk (they pre-compute embeddings in memory, or encode every step).
CACHES: dict[str, Any] = {}

#: What "not settable" says here: the scripts are plain files people copy and edit; te-align does not patch them.
NOT_SETTABLE = "not settable by a flag: hard-coded in the example script (edit its tokenize_prompt/encode_prompt)"


# ------------------------------------------------------------------------------------ converters
def _clip_len(v: Any, ctx: Context) -> Any:
    # tokenize_prompt: max_length = tokenizer_max_length if given, else tokenizer.model_max_length (77 for CLIP)
    n = _rules._int_or_none(v)
    return 77 if n is None else n


def _clip_len_back(p: Any, ctx: Context) -> Any:
    return _rules.REMOVE if p == 77 else p


def _t5_len(v: Any, ctx: Context) -> Any:
    """T5 length: --max_sequence_length, except where the script tokenizes T5 itself while training the text
    encoders (SD3: tokenize_prompt's hard-coded 77; FLUX full fine-tune: 512 for the instance prompt)."""
    fixed = _fixed_t5(ctx)
    return fixed if fixed is not None else _rules._int_or_none(v)


def _t5_len_back(p: Any, ctx: Context) -> Any:
    if _fixed_t5(ctx) is not None:
        raise LookupError
    return p


def _fixed_t5(ctx: Context) -> int | None:
    """The hard-coded T5 length the script uses in this run, if any (see :attr:`Script.te_t5_fixed`)."""
    script = SCRIPTS.get(str(ctx.values.get("_script")))
    if script is None or not script.te_t5_fixed or not _rules._truthy(ctx.values.get("train_text_encoder")):
        return None
    custom = bool(ctx.values.get("_custom_prompts"))
    when = {"always": True, "custom": custom, "instance": not custom}[script.te_t5_fixed]
    return script.te_t5_length if when else None


def _layers(v: Any, ctx: Context) -> Any:
    """``--text_encoder_out_layers 9 18 27`` (argparse: nargs="+", type=int) -> the tuple of hidden_states indices."""
    items = v if isinstance(v, (list, tuple)) else str(v).replace(",", " ").split()
    try:
        return tuple(int(x) for x in items)
    except (TypeError, ValueError):
        return tuple(items)


def _layers_back(p: Any, ctx: Context) -> Any:
    if not isinstance(p, (list, tuple)):
        raise LookupError  # one layer or a name: the option takes a list of indices
    return [int(x) for x in p]


_rules.register("dx_clip_len", _clip_len, _clip_len_back, "int")
_rules.register("dx_layers", _layers, _layers_back)
_rules.register("dx_t5_len", _t5_len, _t5_len_back, "int")


# ------------------------------------------------------------------------------------ rules
def _src(script: str, lines: str) -> str:
    return f"{SCRIPTS[script].folder}/{script}:{lines}"


def _sd_rules(script: str, tokenize: str, encode: str, keys: bool) -> tuple[Rule, ...]:
    out = []
    for fam, slot in (("sd1", "clip_l"), ("sd2", "clip_h")):
        out.append(Rule(f"{slot}.encoder.layer", (fam,), None, "last",
                        "text_encoder(input_ids)[0]: last_hidden_state (final layer norm applied), no clip_skip",
                        _src(script, encode)))
        if keys:
            out.append(Rule(f"{slot}.tokenizer.max_length", (fam,), "tokenizer_max_length", None,
                            "--tokenizer_max_length (unset = tokenizer.model_max_length, 77)", _src(script, tokenize),
                            convert="dx_clip_len"))
            out.append(Rule(f"{slot}.masks.encoder", (fam,), "text_encoder_use_attention_mask", False,
                            "--text_encoder_use_attention_mask passes the tokenizer mask to the CLIP encoder",
                            _src(script, encode), convert="bool"))
        else:
            out.append(Rule(f"{slot}.tokenizer.max_length", (fam,), None, 77,
                            "max_length=tokenizer.model_max_length (77), hard-coded", _src(script, tokenize)))
    return tuple(out)


def _sdxl_rules(script: str, tokenize: str, layer: str) -> tuple[Rule, ...]:
    return (
        Rule("clip_l.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2] of both encoders, no final LN",
             _src(script, layer)),
        Rule("clip_g.encoder.layer", ("sdxl",), None, "penultimate", "hidden_states[-2] of both encoders, no final LN",
             _src(script, layer)),
        Rule("clip_g.encoder.pooled", ("sdxl",), None, "text_embeds", "pooled = output[0] of text_encoder_2 "
             "(CLIPTextModelWithProjection.text_embeds)", _src(script, layer)),
        Rule("clip_l.tokenizer.max_length", ("sdxl",), None, 77, "max_length=tokenizer.model_max_length (77)",
             _src(script, tokenize)),
        Rule("clip_g.tokenizer.max_length", ("sdxl",), None, 77, "max_length=tokenizer.model_max_length (77)",
             _src(script, tokenize)),
    )


def _sd3_rules(script: str, arg: str, t5: str, tok: str, clip: str) -> tuple[Rule, ...]:
    return (
        Rule("t5.tokenizer.max_length", ("sd3",), "max_sequence_length", 77,
             "--max_sequence_length (default 77); with --train_text_encoder the T5 ids come from tokenize_prompt's "
             "hard-coded max_length=77" + (" when captions come from --caption_column" if SCRIPTS[script].te_t5_fixed
                                           == "custom" else ""),
             f"{_src(script, arg)}; {_src(script, t5)}; {_src(script, tok)}", convert="dx_t5_len"),
        Rule("clip_l.encoder.layer", ("sd3",), None, "penultimate", "hidden_states[-2], no final LN", _src(script, clip)),
        Rule("clip_g.encoder.layer", ("sd3",), None, "penultimate", "hidden_states[-2], no final LN", _src(script, clip)),
        Rule("clip_l.tokenizer.max_length", ("sd3",), None, 77, "max_length=77", _src(script, clip)),
        Rule("clip_g.tokenizer.max_length", ("sd3",), None, 77, "max_length=77", _src(script, clip)),
        Rule("t5.masks.encoder", ("sd3",), None, False, "T5 is called without attention_mask", _src(script, t5)),
    )


def _flux_rules(script: str, arg: str, t5: str, clip: str, te_tok: str = "") -> tuple[Rule, ...]:
    default = 512 if script in ("train_dreambooth_lora_flux.py", "train_dreambooth_lora_flux_kontext.py") else 77
    extra = (f"; with --train_text_encoder and --instance_prompt only, the T5 ids come from tokenize_prompt(..., "
             f"max_sequence_length=512) ({_src(script, te_tok)})") if te_tok else ""
    return (
        Rule("t5.tokenizer.max_length", ("flux",), "max_sequence_length", default,
             f"--max_sequence_length (default {default}){extra}", f"{_src(script, arg)}; {_src(script, t5)}",
             convert="dx_t5_len"),
        Rule("t5.masks.encoder", ("flux",), None, False, "T5 is called without attention_mask", _src(script, t5)),
        Rule("clip_l.encoder.pooled", ("flux",), None, "pooler_output", "CLIP-L pooler_output", _src(script, clip)),
        Rule("clip_l.tokenizer.max_length", ("flux",), None, 77, "max_length=77", _src(script, clip)),
    )


_LAYERS_MEANING = ("--text_encoder_out_layers (argparse default [10, 20, 30], FLUX.2 dev's Mistral layers) is passed "
                   "to {pipe}.encode_prompt(text_encoder_out_layers=...), which taps those hidden_states; the "
                   "instance, class, validation and caption-dropout \"\" embeddings all use it")


def _flux2_rules(script: str, slot: str, fam: str, arg: str, enc: str, layers: str = "") -> tuple[Rule, ...]:
    """FLUX.2 dev (``mistral``) / klein (``qwen3``): the script hands --max_sequence_length (and, where it has it,
    --text_encoder_out_layers) to the pipeline's encode_prompt; everything else is the pipeline's."""
    pipe = "Flux2KleinPipeline" if fam == "flux2-klein" else "Flux2Pipeline"
    rows = [Rule(f"{slot}.tokenizer.max_length", (fam,), "max_sequence_length", 512,
                 f"--max_sequence_length (default 512), passed to {pipe}.encode_prompt(max_sequence_length=...)",
                 f"{_src(script, arg)}; {_src(script, enc)}")]
    if layers:
        rows.append(Rule(f"{slot}.encoder.layer", (fam,), "text_encoder_out_layers", [10, 20, 30],
                         _LAYERS_MEANING.format(pipe=pipe), f"{_src(script, layers)}; {_src(script, enc)}",
                         convert="dx_layers", severity="error"))
    else:
        official = (9, 18, 27) if fam == "flux2-klein" else (10, 20, 30)
        rows.append(Rule(f"{slot}.encoder.layer", (fam,), None, official,
                         f"no --text_encoder_out_layers option: {pipe}.encode_prompt(prompt, max_sequence_length) "
                         f"keeps the pipeline's own layers {official}", _src(script, enc)))
    return tuple(rows)


def _llm_len_rules(script: str, slot: str, fam: str, pipe: str, arg: str, enc: str) -> tuple[Rule, ...]:
    return (Rule(f"{slot}.tokenizer.max_length", (fam,), "max_sequence_length", 512,
                 f"--max_sequence_length (default 512), passed to {pipe}.encode_prompt(max_sequence_length=...)",
                 f"{_src(script, arg)}; {_src(script, enc)}"),)


RULES_BY_SCRIPT: dict[str, tuple[Rule, ...]] = {
    "train_dreambooth_lora.py": _sd_rules("train_dreambooth_lora.py", "500-506,725-737", "507-512,742-755", True),
    "train_dreambooth.py": _sd_rules("train_dreambooth.py", "547-553,772-784", "554-559,789-802", True),
    "train_text_to_image_lora.py": _sd_rules("train_text_to_image_lora.py", "661-663", "887", False),
    "train_text_to_image.py": _sd_rules("train_text_to_image.py", "794-796", "993", False),
    "train_dreambooth_lora_sdxl.py": _sdxl_rules("train_dreambooth_lora_sdxl.py", "943-953", "956-980"),
    "train_text_to_image_lora_sdxl.py": _sdxl_rules("train_text_to_image_lora_sdxl.py", "514-524", "527-551"),
    "train_text_to_image_sdxl.py": _sdxl_rules("train_text_to_image_sdxl.py", "516-524", "502-540"),
    "train_dreambooth_lora_sd3.py": _sd3_rules("train_dreambooth_lora_sd3.py", "338-343", "935-972",
                                               "923-932,1746-1757", "975-1011"),
    "train_dreambooth_sd3.py": _sd3_rules("train_dreambooth_sd3.py", "314-319", "867-898", "855-864,1564-1567,1605-1610",
                                          "901-937"),
    "train_dreambooth_lora_flux.py": _flux_rules("train_dreambooth_lora_flux.py", "348-353", "943-984", "987-1028"),
    "train_dreambooth_flux.py": _flux_rules("train_dreambooth_flux.py", "328-333", "897-938", "941-982", "1437"),
    "train_dreambooth_lora_flux_kontext.py": _flux_rules("train_dreambooth_lora_flux_kontext.py", "367-371",
                                                         "1117-1158", "1161-1202"),
    "train_dreambooth_lora_flux2.py": _flux2_rules("train_dreambooth_lora_flux2.py", "mistral", "flux2", "352-357",
                                                   "1530-1537", "358-364"),
    "train_dreambooth_lora_flux2_img2img.py": _flux2_rules("train_dreambooth_lora_flux2_img2img.py", "mistral",
                                                           "flux2", "353-358", "1482-1487"),
    "train_dreambooth_lora_flux2_klein.py": _flux2_rules("train_dreambooth_lora_flux2_klein.py", "qwen3",
                                                         "flux2-klein", "352-357", "1533-1540", "358-364"),
    "train_dreambooth_lora_flux2_klein_img2img.py": _flux2_rules("train_dreambooth_lora_flux2_klein_img2img.py",
                                                                 "qwen3", "flux2-klein", "354-359", "1476-1481"),
    "train_dreambooth_lora_z_image.py": _llm_len_rules("train_dreambooth_lora_z_image.py", "qwen3", "z-image",
                                                       "ZImagePipeline", "352-357", "1517-1523"),
    "train_dreambooth_lora_qwen_image.py": _llm_len_rules("train_dreambooth_lora_qwen_image.py", "qwen", "qwen-image",
                                                          "QwenImagePipeline", "342-347", "1492-1496"),
    # Krea 2: Krea2Pipeline.from_pretrained (its text_encoder_select_layers restored from the pipeline config) and
    # its encode_prompt(prompt, max_sequence_length=...): template, suffix after the padding, cumsum positions and the
    # mask to the transformer are the pipeline's
    "train_dreambooth_lora_krea2.py": _llm_len_rules("train_dreambooth_lora_krea2.py", "qwen", "krea2",
                                                     "Krea2Pipeline", "439-444", "1336-1345,1585-1590"),
    # Ideogram 4: Ideogram4Pipeline.encode_prompt(prompt, grid_h, grid_w, max_sequence_length=...); the
    # --text_encoder_out_layers option is commented out (:439-445), so the taps are the pipeline's
    "train_dreambooth_lora_ideogram4.py": (
        Rule("qwen.tokenizer.max_length", ("ideogram4",), "max_sequence_length", 2048,
             "--max_sequence_length (default 2048), passed to Ideogram4Pipeline.encode_prompt(max_sequence_length=...): "
             "the text block every caption is left-padded to (a longer caption is refused), and the text padding the "
             "script packs in front of the image tokens",
             f"{_src('train_dreambooth_lora_ideogram4.py', '430-438')}; "
             f"{_src('train_dreambooth_lora_ideogram4.py', '1679-1685,1964-1972')}"),
    ),
}
#: All rows (for tools that list every trainer's table).
RULES: tuple[Rule, ...] = tuple(r for rows in RULES_BY_SCRIPT.values() for r in rows)


# ------------------------------------------------------------------------------------ flags
#: The generated table of each script's argparse options (tools/gen_audit_keys.py diffusers-examples-options).
OPTIONS = "diffusers-examples-options"


@functools.cache
def flags(script: str) -> dict[str, str]:
    """The script's options (no leading ``--``) and their kind: ``int``, ``float``, ``str``, ``flag``, ``list``."""
    res = resources.files(__package__).joinpath("data", "diffusers-examples.txt")
    table: dict[str, dict[str, str]] = {}
    current = None
    for raw in res.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = table.setdefault(line[1:-1], {})
            continue
        if current is not None:
            name, _, kind = line.partition(" ")
            current[name] = kind.strip() or "str"
    return table.get(script, {})


def scan_flags(source: str) -> dict[str, str]:
    """Options of a script's argparse parser, read from its source (``add_argument("--name", type=…, action=…)``)."""
    import ast

    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [n for n in names if n.startswith("--")]
        if not longs:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        kind = "str"
        action = kw.get("action")
        if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
            kind = "flag"
        elif "nargs" in kw and not (isinstance(kw["nargs"], ast.Constant) and kw["nargs"].value in (1, "?")):
            kind = "list"
        elif isinstance(kw.get("type"), ast.Name) and kw["type"].id in ("int", "float"):  # type: ignore[union-attr]
            kind = kw["type"].id  # type: ignore[union-attr]
        for n in longs:
            out[n[2:]] = kind
    return out


def _scalar(kind: str, s: str) -> Any:
    if kind == "int":
        return int(s)
    if kind == "float":
        return float(s)
    return s


def read_args(script: str, args: list[str], file: str, line: Any = lambda key: None,
              ) -> tuple[dict[str, Any], list[Finding], dict[str, str]]:
    """``--key value`` / ``--key=value`` / ``--flag`` as the script's argparse reads them.

    Returns (values by option name, findings for unknown options / values of the wrong type, how each
    option was written)."""
    table = flags(script)
    values: dict[str, Any] = {}
    written: dict[str, str] = {}
    findings: list[Finding] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("--") or a == "--":
            continue
        name, eq, val = a[2:].partition("=")
        options = parser_options(__package__, OPTIONS, script)
        if options is None:
            full, matches = resolve_abbrev(name, table)
        else:  # the script's own parser: its -h/--help too, ambiguous matches in its order
            found, matches = options.resolve("--" + name)
            matches = [m[2:] for m in matches]
            full = found[2:] if found else None
            src = f"{SCRIPTS[script].folder}/{script} parse_args (argparse)"
            if found is not None and options.dests[found] == "help":
                findings.append(Finding(kind="wrong-value", severity="error", setting=found, key=name,
                                        message=f"--{name} is {found} to argparse: {script} prints its help and "
                                                "exits without training", fix=f"remove --{name}",
                                        trainer_source=f"diffusers: {src}"))
                continue
            if found is not None and full != name:
                findings.append(Finding(kind="note", severity="info", setting=found, key=full, line=line(name),
                                        message=f"--{name} is an abbreviation: argparse reads it as {found}, the one "
                                                "option it starts", fix=f"write {found} in full",
                                        trainer_source=f"diffusers: {src}"))
        if full is None and len(matches) > 1:
            src = f"{SCRIPTS[script].folder}/{script} parse_args (argparse)"
            findings.append(ambiguous_finding(name, matches, trainer=f"diffusers: {src}"))
            if not eq and i < len(args) and not args[i].startswith("--"):
                i += 1
            continue
        if full is None:
            src = f"{SCRIPTS[script].folder}/{script} parse_args (argparse)"
            findings.append(unknown_key_finding(
                name, set(table), trainer=f"diffusers: {src}", line=line(name), severity="error",
                behaviour=f"{script}'s argparse stops with 'unrecognized arguments: --{name}'"))
            if not eq and i < len(args) and not args[i].startswith("--"):
                i += 1
            continue
        kind = table[full]
        written[full] = name
        if kind == "flag":
            values[full] = True
            continue
        if kind == "list":
            items = [val] if eq else []
            while not eq and i < len(args) and not args[i].startswith("--"):
                items.append(args[i])
                i += 1
            values[full] = items
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("--"):
                findings.append(_wrong(file, full, "expected one argument"))
                continue
            val = args[i]
            i += 1
        try:
            values[full] = _scalar(kind, val)
        except ValueError:
            what = "a whole number" if kind == "int" else "a number"
            findings.append(_wrong(file, full, f"expected {what}, got {val!r} (argparse: invalid {kind} value)"))
    return values, findings, written


def _wrong(file: str, key: str, problem: str) -> Finding:
    return Finding(kind="wrong-value", severity="error", setting=f"--{key}",
                   message=f"wrong type/value for --{key}: {problem}", key=key)


# ------------------------------------------------------------------------------------ parse
def guess_profile(script: str, values: dict[str, Any]) -> tuple[str, str, bool]:
    """(profile, why, only a default) for the script: the model the files or name of --pretrained_model_name_or_path
    say when that is a model of the script's families, else the script's own default model (assumed: the reason
    carries the assumption, :func:`te_align.audit.parsed.reason`)."""
    spec = SCRIPTS[script]
    path = values.get("pretrained_model_name_or_path")
    by_name, detail, decided = guess_model(path)
    if by_name and decided and bundled_name(by_name) is None:
        # a model (or version) te-align has no profile for: named, so that check says "not checked" and names the
        # nearest, never the script's default in its place
        return by_name, f"script {script} and --pretrained_model_name_or_path {path!r}{detail}", False
    if by_name and decided and bundled_families().get(by_name) in _FAMILIES[spec.kind]:
        return by_name, f"script {script} and --pretrained_model_name_or_path {path!r}{detail}", False
    why = f"script {script} (its family's default profile; pass --profile to choose)"
    choices = profiles_of(_FAMILIES[spec.kind])
    if len(choices) < 2:
        return spec.default_profile, why, True
    bases = community_bases()
    if len([c for c in choices if bases.get(c, ("",))[0] != spec.default_profile]) < 2:
        # the only other choices are community bases of the default (sdxl-pony): say which base was assumed and how
        # to pass one
        return spec.default_profile, reason(why, assumption(
            spec.default_profile, f"--pretrained_model_name_or_path {path!r} (its name or files)")), True
    said = (f"{spec.default_profile} assumed: --pretrained_model_name_or_path {path!r} (its name or files) does not "
            f"say which of {', '.join(choices)} it is; pass --profile NAME for another")
    return spec.default_profile, reason(why, said), True


def detect(raw: RawConfig) -> int | None:
    """A command line (the scripts' own names score higher; any other train*.py is still read here, so that an
    unsupported script gets this reader's own message)."""
    if raw.fmt != "cmdline" or not isinstance(raw.data, dict):
        return None
    return 50 if raw.data.get("script") in SCRIPTS else 10


def parse(raw: RawConfig, extra_args: list[str]) -> Parsed:
    if raw.fmt != "cmdline" or not isinstance(raw.data, dict):
        raise UnreadableConfig("expected a command line (accelerate launch train_*.py ARGS…) in a .sh/.txt/.bat file "
                               "or after `te-align check --`", file=raw.file)
    script = str(raw.data["script"])
    if script not in SCRIPTS:
        known = ", ".join(SCRIPTS)
        at = raw.data.get("line")
        raise UnreadableConfig(f"{script} is not a script te-align reads: not one of sd-scripts' (flux_train_network.py, "
                               "sdxl_train_network.py, train_network.py, …), musubi-tuner's "
                               f"(qwen_image_train_network.py, …) or the diffusers examples ({known})",
                               file=f"{raw.file}:{at}" if at else raw.file)
    args = [*raw.data["args"], *extra_args]  # type: ignore[misc]
    text = raw.text
    written: dict[str, str] = {}

    def line(key: str) -> int | None:
        return None if raw.data.get("from_argv") else arg_line(text, written.get(key, key))  # type: ignore[union-attr]

    values, findings, seen = read_args(script, args, raw.file, line)
    written.update(seen)
    bad = [f for f in findings if f.kind == "wrong-value"]
    if bad:  # argparse stops before training: one line, as for any unreadable config
        where = line(str(bad[0].key))
        raise UnreadableConfig(bad[0].message, file=f"{raw.file}:{where}" if where else raw.file)
    values["_script"] = script
    values["_custom_prompts"] = bool(values.get("dataset_name") and values.get("caption_column"))
    prof, reason, _ = guess_profile(script, values)

    def fix_set(key: str, value: Any) -> str:
        if value is True:
            return f"--{key}"
        if isinstance(value, (list, tuple)):  # an nargs="+" option: its values as separate words
            return f"--{key} " + " ".join(str(v) for v in value)
        return f"--{key} {value if not isinstance(value, str) else json.dumps(value)}"

    def fix_remove(key: str) -> str:
        return f"remove --{key}"

    def after(profile: AlignmentProfile, ctx: Context) -> list[Finding]:
        if script == "train_dreambooth_lora_krea2.py" and values.get("caption_dropout"):
            key = "caption_dropout"
            return dropout_form_finding(
                profile, values[key], "encode", key=f"--{key}", trainer="diffusers",
                source=_src(script, "564-572,1608-1612,1814-1820") + " (a dropped caption becomes the encoding of '')",
                line=line(key), fix=f"remove --{key} (the script cannot drop captions as zeros)")
        key = "proportion_empty_prompts"
        if script != "train_text_to_image_sdxl.py" or key not in values:
            return []
        return dropout_form_finding(
            profile, values[key], "encode", key=f"--{key}", trainer="diffusers",
            source=_src(script, "502-509") + " (a dropped caption becomes '' and is encoded)", line=line(key),
            fix=f"remove --{key} (the script cannot drop captions as zeros)")

    trainer = Trainer(NAME, RULES_BY_SCRIPT[script], fix_set, fix_remove, line, not_settable=NOT_SETTABLE)
    # the script fixes the family: --profile may pick another variant of it (sd35-large for the SD3 script), not
    # another family (guess_is_default False)
    return Parsed(trainer, values, prof, reason, False, None, findings, SUPPORTED, after=after,
                  assumed=getattr(reason, "assumed", ""))


def _main(argv: list[str] | None = None) -> int:
    """``python -m te_align.trainers.diffusers_examples.audit CHECKOUT``: print the bundled flag table."""
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "examples" / "dreambooth").is_dir():
        print("usage: python -m te_align.trainers.diffusers_examples.audit DIFFUSERS_CHECKOUT", file=sys.stderr)
        return 2
    root = Path(args[0])
    print(f"# Generated by `python -m te_align.trainers.diffusers_examples.audit CHECKOUT` from "
          f"huggingface/diffusers@{COMMIT}.")
    print("# Options of the example training scripts (names and kinds: int, float, str, flag, list).")
    for name, spec in SCRIPTS.items():
        print(f"[{name}]")
        for flag, kind in sorted(scan_flags((root / spec.folder / name).read_text(encoding="utf-8")).items()):
            print(f"{flag} {kind}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
