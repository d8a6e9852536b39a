"""``te-align inspect FILE.safetensors``: the te-align stamp and kohya text-encoder settings (header only; no torch)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from te_align import kohya_lora
from te_align._lazy import lazy_module

if TYPE_CHECKING:
    from te_align.metadata import FileMetadata

# Lazy: what only this command needs, loaded when it runs (the CLI's other commands stay cold).
_metadata = lazy_module("te_align.metadata")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show the te-align stamp and kohya text-encoder settings of a .safetensors file")
    p.add_argument("file", metavar="FILE.safetensors")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)


kohya_lines = kohya_lora.describe
_onoff = kohya_lora.onoff
_short = kohya_lora.short


def stamp_lines(data: FileMetadata) -> list[str]:
    """Plain-words description of the te_align section of :func:`te_align.metadata.read`'s result."""
    te = data["te_align"]
    if not data["stamped"]:
        return ["no te-align stamp"]
    check = data["profile_check"] or {}
    name, fp = te.get("te_align.profile", "?"), te.get("te_align.fingerprint", "?")
    lines = [f"profile {name}, fingerprint {fp}"]
    world = check.get("world_base")
    changed = check.get("world_base_differences") or []
    if world and not changed:
        lines.append(f"  trained on te-align's world base {world} with its own profile ({name} fitted to "
                     f"the base's tiny encoders, fingerprint {fp}); matches it")
    elif world:
        lines.append(f"  trained on te-align's world base {world} with its own profile ({name} fitted to the base's "
                     f"tiny encoders) changed in {len(changed)} value(s):")
        for d in changed[:12]:
            lines.append(f"    {d['path']}: stamped {_short(d['stamped'], 40)}, base {_short(d['base'], 40)}")
        if len(changed) > 12:
            lines.append(f"    … and {len(changed) - 12} more")
    elif check.get("bundled"):
        if check.get("matches"):
            lines.append(f"  matches the current bundled profile {check.get('bundled_name', name)}")
        else:
            diffs = check.get("differences") or []
            lines.append(
                f"  does NOT match the current bundled profile {check.get('bundled_name', name)} "
                f"(now {check.get('current_fingerprint')})" + (f"; {len(diffs)} value(s) differ:" if diffs else "")
            )
            for d in diffs[:12]:
                lines.append(f"    {d['path']}: stamped {_short(d['stamped'], 40)}, bundled now {_short(d['current'], 40)}")
            if len(diffs) > 12:
                lines.append(f"    … and {len(diffs) - 12} more")
    else:
        lines.append(f"  '{name}' is not a bundled profile")
    same = [s for s in check.get("same_behaviour_as", []) if s != name]
    if same:
        lines.append(f"  same behaviour as bundled: {', '.join(same)}")
    lines.append(
        f"  family {te.get('te_align.family', '-')}, empty prompt: {te.get('te_align.empty_prompt', '-')}, "
        f"stamped by te-align {te.get('te_align.version', '?')}"
    )
    slots = [s for s in str(te.get("te_align.slots", "")).split(",") if s]
    for s in slots:
        b = f"te_align.{s}."
        if _onoff(te.get(b + "tokenizer_only")) == "on":
            lines.append(f"  {s}: max {te.get(b + 'max_length', '?')} tokens, tokenized only (no encoder), "
                         f"denoiser mask {_onoff(te.get(b + 'masks.denoiser'))}")
            continue
        lines.append(
            f"  {s}: max {te.get(b + 'max_length', '?')} tokens, layer {te.get(b + 'layer', '?')}, "
            f"final LN {_onoff(te.get(b + 'final_layer_norm'))}, pooled {te.get(b + 'pooled', '?')}, "
            f"masks: encoder {_onoff(te.get(b + 'masks.encoder'))}, zero-padded {_onoff(te.get(b + 'masks.zero_padded'))}, "
            f"denoiser {_onoff(te.get(b + 'masks.denoiser'))}"
        )
    for k, v in te.items():
        if k.startswith("te_align.extra."):
            lines.append(f"  {k.removeprefix('te_align.extra.')}: {_short(v, 100)}")
    return lines


def _unsafe(c: str) -> bool:
    import unicodedata

    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def escape(text: str) -> str:
    """``text`` with control and format characters (ESC, CR, bidi overrides …) written as ``\\xNN`` / ``\\uNNNN``:
    metadata is written by whoever made the file and must not drive the terminal."""
    out = []
    for c in text:
        if _unsafe(c):
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(c)
    return "".join(out)


def escape_json(text: str) -> str:
    """JSON text (from ``json.dumps``) with format characters also written as ``\\uNNNN`` escapes (still valid JSON)."""
    out = []
    for c in text:
        if c != "\n" and _unsafe(c):
            units = c.encode("utf-16-be")
            out.extend(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))
        else:
            out.append(c)
    return "".join(out)


def cmd_inspect(args: argparse.Namespace) -> int:
    data = _metadata.read(args.file)
    if args.json:
        print(escape_json(json.dumps(data, indent=2, ensure_ascii=False)))
        return 0
    print(escape(f"{data['path']}: {data['tensor_count']} tensors, {data['metadata_keys']} metadata keys"))
    print("\n[te-align]")
    for line in stamp_lines(data):
        print(f"  {escape(line)}")
    print("\n[kohya sd-scripts text encoder]")
    for line in kohya_lines(data["kohya"], data.get("text_encoder_tensors")):
        print(f"  {escape(line)}")
    return 0
