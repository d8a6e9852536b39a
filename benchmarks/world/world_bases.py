"""The shipped world bases' table (docs/world.md, the README): what each base.json records.

    python benchmarks/world/world_bases.py

For every base in world/te_align_world: its diffusers class, profile, samples seen, training seconds on the
2-core machine (the denoiser's own; the shared autoencoder and encoders are listed once below the table), and
the held-out accuracy that tools/ship_base.py measured with plain calls of the shipped pipeline (64 prompts per
caption style, dataset seed 20000; "visible": the object is described inside some encoder's window).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from te_align.tiny import bases


def _chain(enc: dict) -> str:
    """A klein encoder chain (``init_record`` links, the last set first) as one sentence, first set first."""
    links = []
    while enc:
        links.append(enc)
        enc = enc.get("init_record") or {}
    parts = []
    for i, link in enumerate(reversed(links)):
        c = link["config"]
        what = "trained from scratch" if i == 0 else "continued"
        extra = [f"{k} {c[k]:g}" for k in ("insert", "delete", "case") if c.get(k)]
        if c.get("lm_weight", 1.0) != 1.0:
            extra.append(f"next-token weight {c['lm_weight']:g}")
        parts.append(f"{what} {c['steps']:,} steps" + (f" ({', '.join(extra)})" if extra else "")
                     + f" ({link['metrics']['train_seconds']:,.0f} s)")  # fmt: skip
    return ", then ".join(parts)


def main() -> None:
    root = bases.data_root()
    infos = [bases.base_info(name) for name in bases.shipped()]
    print("| base | pipeline / denoiser | profile | steps (samples) | training s | colour | position | shape | "
          "objects exact | spurious / image | visible prompts |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for info in infos:
        v, p = info["metrics"]["heldout"]["visible"], info["pretrain"]
        print(f"| {info['name']} | {info['pipeline']} / {info['denoiser_class']} | {info['profile']} | "
              f"{p['steps']:,} ({p['samples_seen'] // 1000} k) | {p['train_seconds']:,.0f} | {v['colour']:.1%} | "
              f"{v['position']:.1%} | {v['shape']:.1%} | {v['object_accuracy']:.1%} | {v['extra_per_image']:.2f} | "
              f"{v['prompts']:.0f} of {info['metrics']['heldout']['prompts']} |")  # fmt: skip
    if infos:
        p = infos[0]["pretrain"]
        print(f"\nShared by every base: the autoencoder ({p['vae']['train_seconds']:,.0f} s of training) and the text "
              f"encoders ({p['encoders']['metrics']['train_seconds']:,.0f} s).")  # fmt: skip
        for info in infos:  # a base with an encoder set of its own, continued from the shared one
            enc = info["pretrain"].get("encoders", {})
            if enc.get("kind") == "klein":  # its own Qwen3, trained from scratch as a chain of sets
                print(f"The {info['name']} base's own Qwen3: {_chain(enc)}.")
            elif enc.get("config", {}).get("init"):
                c = enc["config"]
                print(f"The {info['name']} base's own {' and '.join(c['train_only'])}: the shared one continued "
                      f"{c['steps']:,} steps" + (f" on captions recased with probability {c['case']:g}" if c.get("case")
                      else "") + f" ({enc['metrics']['train_seconds']:,.0f} s).")  # fmt: skip
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"Shipped: {size / 2**20:.1f} MB in {root.relative_to(Path(bases.__file__).resolve().parents[2])}.")


if __name__ == "__main__":
    main()
