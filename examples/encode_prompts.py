"""Encode prompts exactly as a model's official pipeline does, with an embedding cache and a LoRA stamp.

    python examples/encode_prompts.py MODEL [--profile NAME] [--cache DIR] [--stamp LORA.safetensors] PROMPT...

MODEL is a diffusers-format folder or a hub repo id (the text encoders are loaded from it). The
profile is built from MODEL's own config files unless --profile names one (e.g. flux-schnell).
"""

from __future__ import annotations

import argparse

import te_align
from te_align.encoding.cache.keys import hash_text_encoders
from te_align.encoding.cache.store import EmbeddingCache
from te_align.metadata import stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="diffusers folder or hub repo id")
    ap.add_argument("prompts", nargs="+")
    ap.add_argument("--profile", help="bundled profile name or profile file (default: built from MODEL)")
    ap.add_argument("--cache", help="embedding cache folder")
    ap.add_argument("--stamp", metavar="LORA", help="stamp this LoRA .safetensors with the profile")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    profile = te_align.profile(args.profile or args.model)
    print(f"profile {profile.name} (fingerprint {profile.fingerprint()})")
    tokenizers, encoders = te_align.load_text_encoders(profile, args.model, device=args.device)

    def encode(captions: list[str]) -> te_align.encoding.Conditioning:
        return te_align.encode(profile, captions, tokenizers=tokenizers, text_encoders=encoders)

    if args.cache:
        cache = EmbeddingCache(args.cache, profile, hash_text_encoders(encoders, tokenizers))
        results = cache.get_or_encode(args.prompts, encode)
        print(f"cache: {cache.stats}")
    else:
        results = encode(args.prompts).split()
    for prompt, cond in zip(args.prompts, results, strict=True):
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in cond.items())
        print(f"{prompt[:40]!r}: {shapes}")
    if args.stamp:
        stamp(args.stamp, profile=profile)
        print(f"stamped {args.stamp}; check it with: te-align inspect {args.stamp}")


if __name__ == "__main__":
    main()
