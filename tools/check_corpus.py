"""Run ``te-align check`` on every training config the trainers ship, the way a new user would.

Maintainer script (needs trainer checkouts, no network, no torch)::

    python tools/check_corpus.py [--kohya DIR] [--kohya-gui DIR] [--ai-toolkit DIR] [--onetrainer DIR]
                                 [--simpletuner DIR] [--musubi DIR] [--diffusion-pipe DIR]
                                 [--list] [--show-findings KIND] [--kinds]

Each checkout comes from its option or its environment variable, the one the trainer registry names for the
config language (``TrainerSpec.env_dir``, or the dialect's own for the kohya_ss GUI): ``TE_ALIGN_KOHYA_DIR``
(kohya-ss/sd-scripts), ``TE_ALIGN_KOHYA_GUI_DIR`` (bmaltais/kohya_ss), ``TE_ALIGN_AI_TOOLKIT_DIR`` and so on;
``--help`` lists each with its repository.

What it reads, per trainer:

- ai-toolkit: ``config/examples/**/*.y*ml`` and ``extensions*/**/config/*.y*ml``;
- kohya_ss GUI: ``presets/**/*.json`` and ``test/config/*.json`` (the ``.toml`` files there are dataset configs);
- sd-scripts: every ``accelerate launch … <script>.py --flag …`` command in ``docs/*.md`` (English pages), as
  ``te-align check EMPTY.toml -- <script>.py --flag …``;
- OneTrainer: ``training_presets/**/*.json``;
- SimpleTuner: ``simpletuner/examples/*/config.json|toml`` and the JSON blocks with ``model_family`` in the
  English ``documentation/quickstart/*.md`` pages;
- musubi-tuner: every command line in ``docs/*.md`` and ``README.md`` that runs a training or caching script
  (``*train*.py``, ``*cache_text_encoder_outputs.py``, ``*cache_latents.py``, ``*cache_pixel.py``), each saved as a
  one-command ``.sh`` file (``.ps1`` for PowerShell blocks) without its ``--config_file`` (the doc's TOML is not
  shipped), identical commands once; and every TOML block of those pages (fenced ``toml``, or unlabelled and
  parsing as a TOML table);
- diffusion-pipe: ``examples/*.toml`` as shipped, and each ``[model]`` block of ``docs/supported_models.md``
  put in place of the ``[model]`` table of ``examples/main_example.toml`` (the way its docs say to configure a
  model; Lumina 2 with ``examples/recommended_lumina_dataset_config.toml``, which its section recommends).

It runs :func:`te_align.checking.check_file` in-process on each (timing each) and prints per trainer: configs,
exit-code counts, tracebacks, unknown-key findings, "not checked" results, exits 0 without a rule that ran,
and the median time per file; ``--kinds`` adds the count of every finding kind/severity per trainer. "unknown"
counts unknown-key findings at warning or error severity (a kohya_ss
GUI field of another tab is an info finding and not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



@dataclass
class Case:
    """One shipped config: a file (or a temporary file holding a doc block) plus extra CLI args."""

    name: str
    path: str
    trainer: str
    extra: list[str] = field(default_factory=list)


def _md_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1).strip().lower(), m.group(2)) for m in re.finditer(r"```([^\n`]*)\n(.*?)```", text, re.S)]


def _md_fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, fences read line by line (an inline ```x``` in a paragraph
    opens no block)."""
    out: list[tuple[str, str]] = []
    lang: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        fence = re.match(r"^\s*```([^`]*)$", line)
        if lang is None and fence:
            lang, body = fence.group(1).strip().lower(), []
        elif lang is not None and re.match(r"^\s*```\s*$", line):
            out.append((lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


#: Also read translated doc pages (sd-scripts *-ja/*-zh, SimpleTuner quickstart *.ja.md, …): --all-languages.
ALL_LANGUAGES = {"on": False}


def kohya_cases(root: Path, tmp: Path) -> list[Case]:
    empty = tmp / "sd-scripts-empty.toml"
    empty.write_text("", encoding="utf-8")
    out: list[Case] = []
    for md in sorted((root / "docs").glob("*.md")):
        if re.search(r"[-_](ja|zh)\.md$|README_ja", md.name) and not ALL_LANGUAGES["on"]:
            continue
        for i, (_, body) in enumerate(_md_blocks(md.read_text(encoding="utf-8", errors="replace"))):
            joined = re.sub(r"[ \t]*(\\|\^|`)\r?\n", " ", body)
            for line in joined.splitlines():
                if "accelerate launch" not in line and not re.search(r"python\S*\s+\S*train\S*\.py", line):
                    continue
                try:
                    words = shlex.split(line, posix=True)
                except ValueError:
                    words = line.split()
                script = next((w for w in words if w.endswith(".py")), None)
                if script is None or "train" not in script:
                    continue
                args = [w for w in words[words.index(script):] if w not in ("...", "…")]  # doc placeholders
                if "--config_file" in args:  # the doc's own TOML is not shipped; check the CLI part
                    j = args.index("--config_file")
                    del args[j:j + 2]
                out.append(Case(f"docs/{md.name}#{i}", str(empty), "kohya", args))
    return out


def gui_cases(root: Path, tmp: Path) -> list[Case]:
    files = sorted((root / "presets").rglob("*.json")) + sorted((root / "test" / "config").glob("*.json"))
    files = [p for p in files if not p.name.startswith("meta")]  # finetune caption metadata, not configs
    return [Case(str(p.relative_to(root)), str(p), "auto") for p in files]


def ai_toolkit_cases(root: Path, tmp: Path) -> list[Case]:
    files = [p for p in sorted((root / "config" / "examples").rglob("*")) if p.suffix in (".yaml", ".yml")]
    for ext in sorted(root.glob("extensions*")):
        files += [p for p in sorted(ext.rglob("config/*")) if p.suffix in (".yaml", ".yml")]
    return [Case(str(p.relative_to(root)), str(p), "auto") for p in files]


def onetrainer_cases(root: Path, tmp: Path) -> list[Case]:
    return [Case(str(p.relative_to(root)), str(p), "auto") for p in sorted((root / "training_presets").rglob("*.json"))]


def simpletuner_cases(root: Path, tmp: Path) -> list[Case]:
    ex = root / "simpletuner" / "examples"
    files = sorted(ex.glob("*/config.json")) + sorted(ex.glob("*/config.toml"))
    out = [Case(str(p.relative_to(root)), str(p), "auto") for p in files]
    for md in sorted((root / "documentation" / "quickstart").glob("*.md")):
        if re.search(r"\.[a-z]{2}(-[A-Z]{2})?\.md$", md.name) and not ALL_LANGUAGES["on"]:  # translations
            continue
        for i, (lang, body) in enumerate(_md_blocks(md.read_text(encoding="utf-8", errors="replace"))):
            if lang not in ("json", "") or '"model_family"' not in body:
                continue
            try:
                data = json.loads(body)
            except json.JSONDecodeError:
                continue  # a fragment, not a config a user can save as it is
            if not isinstance(data, dict):
                continue
            p = tmp / f"simpletuner-{md.stem}-{i}.json"  # md.stem keeps the language tag: names stay unique
            p.write_text(body, encoding="utf-8")
            out.append(Case(f"documentation/quickstart/{md.name}#{i}", str(p), "auto"))
    return out


#: musubi-tuner scripts a corpus command runs: training and caching (text encoder, latents, pixels).
MUSUBI_SCRIPT = re.compile(r"(?:^|[\\/\s\"'])(\w*(?:train\w*|cache_text_encoder_outputs|cache_latents|cache_pixel)\.py)\b")


def musubi_cases(root: Path, tmp: Path) -> list[Case]:
    import tomllib

    out: list[Case] = []
    seen: set[str] = set()
    pages = [*sorted((root / "docs").glob("*.md")), root / "README.md"]
    for md in pages:
        if not md.is_file() or (re.search(r"\.ja\.md$", md.name) and not ALL_LANGUAGES["on"]):
            continue
        for i, (lang, body) in enumerate(_md_fences(md.read_text(encoding="utf-8", errors="replace"))):
            name = f"{md.relative_to(root)}#{i}"
            if lang == "toml" or lang == "":
                try:
                    data = tomllib.loads(body)
                except tomllib.TOMLDecodeError:
                    data = None
                if data or lang == "toml":
                    p = tmp / f"musubi-{md.stem}-{i}.toml"
                    p.write_text(body, encoding="utf-8")
                    out.append(Case(name, str(p), "auto"))
                    continue
            ps1 = lang == "powershell"
            joined = re.sub(r"[ \t]*(\\|\^|`)\r?\n", " ", body)
            for j, line in enumerate(joined.splitlines()):
                m = MUSUBI_SCRIPT.search(line)
                if m is None or not re.search(r"\b(python\S*|accelerate)\b", line):
                    continue
                try:
                    words = shlex.split(line, posix=not ps1)
                except ValueError:
                    words = line.split()
                if "--config_file" in words:  # the doc's own TOML is not shipped; check the command line part
                    k = words.index("--config_file")
                    del words[k:k + 2]
                words = [w for w in words if w not in ("...", "…")]  # doc placeholders
                text = " ".join(shlex.quote(w) for w in words)
                if text in seen:
                    continue
                seen.add(text)
                p = tmp / f"musubi-{md.stem}-{i}-{j}{'.ps1' if ps1 else '.sh'}"
                p.write_text(text + "\n", encoding="utf-8")
                out.append(Case(f"{name} {m.group(1)}", str(p), "auto"))
    return out


#: diffusion-pipe model types whose docs section recommends a dataset config of its own (docs/supported_models.md).
DP_DATASET = {"lumina_2": "examples/recommended_lumina_dataset_config.toml"}


def diffusion_pipe_cases(root: Path, tmp: Path) -> list[Case]:
    import tomllib

    ex = root / "examples"
    out = [Case(str(p.relative_to(root)), str(p), "auto") for p in sorted(ex.glob("*.toml"))]
    main = (ex / "main_example.toml").read_text(encoding="utf-8")
    m = re.search(r"^\[model\]\n.*?(?=^\[)", main, re.S | re.M)
    doc = root / "docs" / "supported_models.md"
    if m is None or not doc.is_file():
        return out
    for i, (_, body) in enumerate(_md_fences(doc.read_text(encoding="utf-8", errors="replace"))):
        try:
            data = tomllib.loads(body)
        except tomllib.TOMLDecodeError:
            continue
        model = data.get("model")
        if not isinstance(model, dict) or "type" not in model:
            continue
        dataset = ex / DP_DATASET.get(str(model["type"]), "examples/dataset.toml").split("/", 1)[1]
        text = main[: m.start()] + body.strip() + "\n\n" + main[m.end():]
        text = re.sub(r"^dataset = .*$", f"dataset = {json.dumps(str(dataset))}", text, count=1, flags=re.M)
        p = tmp / f"diffusion-pipe-{model['type']}-{i}.toml"
        p.write_text(text, encoding="utf-8")
        out.append(Case(f"docs/supported_models.md#{i} ({model['type']}) in examples/main_example.toml", str(p), "auto"))
    return out


#: Where each config language's shipped configs are (the ``check`` dialect names of the trainer registry), in the
#: order the report lists them.
FINDERS = {
    "kohya": kohya_cases,
    "kohya-gui": gui_cases,
    "ai-toolkit": ai_toolkit_cases,
    "onetrainer": onetrainer_cases,
    "simpletuner": simpletuner_cases,
    "musubi": musubi_cases,
    "diffusion-pipe": diffusion_pipe_cases,
}


def checkout_env() -> dict[str, tuple[str, str]]:
    """(environment variable, repository) of the checkout each config language's configs come from, read from the
    trainer registry."""
    from te_align.trainers import dialect

    out = {}
    for name in FINDERS:
        d, spec = dialect(name)
        out[name] = (spec.dialect_env(d) or "", spec.dialect_repo(d))
    return out


#: The environment variable of each config language's checkout (from the registry).
ENV = {name: env for name, (env, _) in checkout_env().items()}


def run(cases: list[Case], show: str | None, listing: bool) -> dict[str, object]:
    from te_align.checking import check_file

    codes: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    tracebacks: list[tuple[str, str]] = []
    unknown = 0
    unknown_files = 0
    not_checked = 0
    unbacked: list[str] = []
    times: list[float] = []
    for case in cases:
        t0 = time.perf_counter()
        try:
            r = check_file(case.path, trainer=case.trainer, extra_args=case.extra)
        except Exception:  # a traceback is exactly what this script counts
            times.append(time.perf_counter() - t0)
            tracebacks.append((case.name, traceback.format_exc()))
            codes["traceback"] += 1
            continue
        times.append(time.perf_counter() - t0)
        codes[r.exit_code] += 1
        kinds.update(f"{f.kind}/{f.severity}" for f in r.findings)
        n_unknown = sum(f.kind == "unknown-key" and f.severity != "info" for f in r.findings)
        unknown += n_unknown
        unknown_files += bool(n_unknown)
        not_checked += getattr(r, "status", "checked") not in ("checked", "unreadable")
        if r.exit_code == 0 and not getattr(r, "rules_ran", ()):
            unbacked.append(case.name)
        if listing:
            print(f"  {r.exit_code} {getattr(r, 'status', '?'):<12} {r.profile or '-':<16} {case.name}")
        if show:
            for f in r.findings:
                if show in ("all", f.kind):
                    print(f"    [{case.name}] {f.kind}/{f.severity} {f.setting}: {f.message[:140]}")
    return {
        "configs": len(cases), "codes": codes, "kinds": kinds, "tracebacks": tracebacks, "unknown": unknown,
        "unknown_files": unknown_files, "not_checked": not_checked, "unbacked": unbacked,
        "median_s": statistics.median(times) if times else 0.0, "max_s": max(times, default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env_of = checkout_env()
    for name, (env, repo) in env_of.items():
        ap.add_argument(f"--{name}", metavar="DIR", help=f"{repo} checkout (default: ${env})")
    ap.add_argument("--list", action="store_true", help="print exit code, status and profile per config")
    ap.add_argument("--show-findings", metavar="KIND", help="print findings of this kind (or 'all')")
    ap.add_argument("--kinds", action="store_true", help="count the findings of each kind/severity per trainer")
    ap.add_argument("--all-languages", action="store_true", help="also read the translated doc pages")
    args = ap.parse_args(argv)
    ALL_LANGUAGES["on"] = args.all_languages
    total_tb = 0
    with tempfile.TemporaryDirectory(prefix="te-align-corpus-") as tmp:
        print(f"{'trainer':<12}{'configs':>8}  {'exit codes':<34}{'tracebacks':>10}{'unknown':>9}"
              f"{'not checked':>12}{'0 w/o rule':>11}{'median s':>10}{'max s':>8}")
        for name, (env, _) in env_of.items():
            root = getattr(args, name.replace("-", "_")) or os.environ.get(env)
            if not root:
                print(f"{name:<12}  skipped: no --{name} and no ${env}")
                continue
            cases = FINDERS[name](Path(root), Path(tmp))
            if args.list or args.show_findings:
                print(f"== {name}")
            res = run(cases, args.show_findings, args.list)
            codes = res["codes"]
            shown = " ".join(f"{k}:{codes[k]}" for k in sorted(codes, key=str))
            print(f"{name:<12}{res['configs']:>8}  {shown:<34}{len(res['tracebacks']):>10}{res['unknown']:>9}"
                  f"{res['not_checked']:>12}{len(res['unbacked']):>11}{res['median_s']:>10.4f}{res['max_s']:>8.3f}")
            if args.kinds:
                kinds = res["kinds"]
                print("  findings: " + (", ".join(f"{k} {kinds[k]}" for k in sorted(kinds)) or "none"))
            for case, tb in res["tracebacks"]:
                total_tb += 1
                print(f"  traceback in {case}:\n" + "\n".join("    " + x for x in tb.strip().splitlines()[-6:]))
            for case in res["unbacked"]:
                print(f"  exit 0 without a rule that ran: {case}")
    return 1 if total_tb else 0


if __name__ == "__main__":
    raise SystemExit(main())
