"""Regenerate ``te_align/trainers/<package>/data/<trainer>.txt``: the config keys each trainer accepts, read from a checkout.

Maintainer script (no network)::

    python tools/gen_audit_keys.py kohya       SD_SCRIPTS_CHECKOUT   [--write]
    python tools/gen_audit_keys.py kohya-gui   KOHYA_SS_CHECKOUT     [--write]
    python tools/gen_audit_keys.py ai-toolkit  AI_TOOLKIT_CHECKOUT   [--write]
    python tools/gen_audit_keys.py onetrainer  ONETRAINER_CHECKOUT   [--write]
    python tools/gen_audit_keys.py simpletuner SIMPLETUNER_CHECKOUT  [--write]
    python tools/gen_audit_keys.py musubi      MUSUBI_TUNER_CHECKOUT [--write]
    python tools/gen_audit_keys.py diffusion-pipe DIFFUSION_PIPE_CHECKOUT [--write]
    python tools/gen_audit_keys.py kohya-options  SD_SCRIPTS_CHECKOUT   [--write]
    python tools/gen_audit_keys.py musubi-options MUSUBI_TUNER_CHECKOUT [--write]
    python tools/gen_audit_keys.py diffusers-examples-options DIFFUSERS_CHECKOUT [--write]

Without ``--write`` it prints the list and the difference to the bundled one. The commit of the checkout
(``git rev-parse HEAD``, or ``--commit``) goes into the file's header. What is read:

- kohya (sd-scripts, Apache-2.0): every ``add_argument("--name", …)`` (its ``dest``) in ``library/*.py`` and the
  top-level ``*train*.py`` scripts (AST).
- kohya-gui (kohya_ss, Apache-2.0): the parameters of ``save_configuration`` per tab (``lora_gui.py``,
  ``dreambooth_gui.py``, ``finetune_gui.py``, ``textual_inversion_gui.py``) minus the ``exclusion`` of its
  ``SaveConfigFile`` call, one section per tab; ``[legacy]`` = keys of older GUI versions that ``update_my_data``
  (``common_gui.py``) migrates when a file is opened (AST).
- ai-toolkit (MIT): ``kwargs.get/pop('key')`` per config class of ``toolkit/config_modules.py``, one section per
  ``config.process[N]`` section; ``[process]`` = ``type`` and every ``get_conf('key')`` of the process classes;
  ``[slider]`` =
  the slider config classes of the slider processes (AST).
- onetrainer (AGPL-3.0: key names only): ``data.append(("key", …))`` in ``TrainConfig.default_values`` (top level)
  and ``TrainModelPartConfig.default_values`` (parts); ``[legacy]`` = keys its config migrations consume, each
  with the ``__version`` below which the migration runs.
- simpletuner (AGPL-3.0: key names only): ``arg_name="--key"`` and ``aliases=[…]`` of the field registry
  (including the names a ``for idx in range(a, b)`` loop generates), plus the legacy keys its config loader
  forwards (``@_legacy_handler("key")``, ``--ignore_final_epochs``); ``[ignored]`` = registry fields with
  ``arg_name=None`` (dropped before argparse).
- musubi (musubi-tuner, Apache-2.0) and diffusion-pipe (MIT): the generators live beside their readers
  (``te_align/trainers/musubi/audit.py``: every ``add_argument("--name")`` that each training and caching script's
  ``main`` reaches, one section per script, plus the dataset config's voluptuous schema;
  ``te_align/trainers/diffusion_pipe/audit.py``: the keys read from each config table); this tool calls them.
- kohya-options, musubi-options, diffusers-examples-options (``data/<name>.txt`` beside the trainer's key list): each
  training and caching script's argparse parser as its main block builds it (``tools/argparse_options.py`` follows
  the calls from ``if __name__ == "__main__":`` to ``parse_args``, reading the source only): one section per script,
  its option strings in registration order (``-h --help`` first), ``> dest`` where the dest is not argparse's default,
  ``!allow_abbrev false`` where the parser turns abbreviations off. ``check`` resolves a prefix by it as argparse does.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commit(root: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit (pass --commit)"


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


# ------------------------------------------------------------------------------------------- sd-scripts
def kohya(root: Path) -> dict[str, set[str]]:
    keys: set[str] = set()
    files = sorted((root / "library").glob("*.py")) + sorted(root.glob("*train*.py"))
    for f in files:
        tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            dest = next((_str(k.value) for k in node.keywords if k.arg == "dest"), None)
            names = [s for s in (_str(a) for a in node.args) if s and s.startswith("--")]
            if dest:
                keys.add(dest)
            elif names:
                keys.add(names[0][2:].replace("-", "_"))
    return {"": keys}


# ------------------------------------------------------------------------------------------ kohya_ss GUI
GUI_TABS = {"lora": "lora_gui.py", "dreambooth": "dreambooth_gui.py", "finetune": "finetune_gui.py",
            "textual_inversion": "textual_inversion_gui.py"}


def kohya_gui(root: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for tab, name in GUI_TABS.items():
        tree = ast.parse((root / "kohya_gui" / name).read_text(encoding="utf-8"))
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "save_configuration")
        params = {a.arg for a in fn.args.args}
        exclusion: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "SaveConfigFile":
                for k in node.keywords:
                    if k.arg == "exclusion" and isinstance(k.value, ast.List):
                        exclusion |= {s for s in map(_str, k.value.elts) if s}
        out[tab] = params - exclusion
    # keys older GUI versions wrote, which update_my_data (common_gui.py) migrates when a file is opened
    common = ast.parse((root / "kohya_gui" / "common_gui.py").read_text(encoding="utf-8"))
    fn = next(n for n in common.body if isinstance(n, ast.FunctionDef) and n.name == "update_my_data")
    legacy = _kwargs_keys(fn, ("my_data",))
    for n in ast.walk(fn):
        if isinstance(n, ast.For) and isinstance(n.iter, (ast.List, ast.Tuple)):
            legacy |= {s for s in map(_str, n.iter.elts) if s}
    out["legacy"] = legacy - set().union(*out.values())
    return out


# ------------------------------------------------------------------------------------------- ai-toolkit
AITK_SECTIONS = {"SaveConfig": "save", "LoggingConfig": "logging", "SampleConfig": "sample", "NetworkConfig": "network",
                 "TrainConfig": "train", "ModelConfig": "model", "DatasetConfig": "datasets"}
AITK_SLIDER = (("toolkit/config_modules.py", "SliderConfig"),
               ("extensions_built_in/image_reference_slider_trainer/ImageReferenceSliderTrainerProcess.py",
                "ReferenceSliderConfig"),
               ("extensions_built_in/ultimate_slider_trainer/UltimateSliderTrainerProcess.py", "UltimateSliderConfig"),
               ("extensions_built_in/concept_slider/ConceptSliderTrainer.py", "ConceptSliderTrainerConfig"))


def _kwargs_keys(node: ast.AST, names: tuple[str, ...] = ("kwargs",)) -> set[str]:
    keys: set[str] = set()
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "pop")
                and isinstance(n.func.value, ast.Name) and n.func.value.id in names and n.args):
            s = _str(n.args[0])
            if s:
                keys.add(s)
        elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in names:
            s = _str(n.slice)
            if s:
                keys.add(s)
    return keys


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def ai_toolkit(root: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    cfg = ast.parse((root / "toolkit" / "config_modules.py").read_text(encoding="utf-8"))
    for cls, section in AITK_SECTIONS.items():
        node = _class(cfg, cls)
        if node is not None:
            out[section] = _kwargs_keys(node)
    slider: set[str] = set()
    for path, cls in AITK_SLIDER:
        f = root / path
        if f.is_file():
            node = _class(ast.parse(f.read_text(encoding="utf-8")), cls)
            if node is not None:
                slider |= _kwargs_keys(node)
    out["slider"] = slider
    process: set[str] = set()
    for f in sorted((root / "jobs" / "process").glob("*.py")) + sorted((root / "extensions_built_in").rglob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:  # a file the trainer cannot import either
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get_conf" and n.args:
                s = _str(n.args[0])
                if s:
                    process.add(s)
    out["process"] = process | {"type"}  # jobs/BaseJob.py:58-66 picks the process class by process['type']
    return out


# ------------------------------------------------------------------------------------------- OneTrainer
def onetrainer(root: Path) -> dict[str, set[str]]:
    text = (root / "modules" / "util" / "config" / "TrainConfig.py").read_text(encoding="utf-8")
    out: dict[str, set[str]] = {}
    # class bodies by name: the text from "class X" to the next top-level "class "
    for cls, section in (("TrainConfig", "top"), ("TrainModelPartConfig", "part")):
        m = re.search(rf"^class {cls}\b.*?(?=^class |\Z)", text, re.S | re.M)
        body = m.group(0) if m else ""
        d = re.search(r"def default_values\(.*?(?=^    def |\Z)", body, re.S | re.M)
        out[section] = set(re.findall(r'data\.append\(\(\s*"(\w+)"', d.group(0) if d else ""))
    out["top"].add("__version")  # BaseConfig.to_dict / from_dict
    out["part"].add("__version")  # every nested BaseConfig (a model part) writes and reads its own version too
    legacy: dict[str, int] = {}
    for m in re.finditer(r"def __migration_(\d+)\(self, data: dict\) -> dict:(.*?)(?=\n    def |\Z)", text, re.S):
        version = int(m.group(1))
        body = m.group(2)
        names = set(re.findall(r'key == ["\'](\w+)["\']', body))
        names |= set(re.findall(r'\.pop\(\s*["\'](\w+)["\']', body))
        names |= set(re.findall(r'["\'](\w+)["\'] in migrated_data', body))
        for n in names:  # the last migration that consumes it: the key is read below that version
            legacy[n] = max(legacy.get(n, 0), version + 1)
    out["legacy"] = {f"{k} {v}" for k, v in legacy.items()}
    return out


# ------------------------------------------------------------------------------------------- SimpleTuner
def simpletuner(root: Path) -> dict[str, set[str]]:
    keys: set[str] = set()
    ignored: set[str] = set()
    dirs = [root / "simpletuner" / "simpletuner_sdk" / "server" / "services" / "field_registry",
            root / "simpletuner" / "helpers" / "models" / "field_registry"]
    loop = re.compile(r"for (\w+) in range\((\d+),\s*(\d+)\)")
    for d in dirs:
        for f in sorted(d.rglob("*.py")):
            text = f.read_text(encoding="utf-8")
            for m in re.finditer(r'arg_name\s*=\s*(f?)"--([\w{}]+)"', text):
                name = m.group(2)
                if m.group(1) and "{" in name:
                    loops = list(loop.finditer(text, 0, m.start()))
                    if not loops:
                        continue
                    var, a, b = loops[-1].groups()
                    keys |= {name.replace("{" + var + "}", str(i)) for i in range(int(a), int(b))}
                else:
                    keys.add(name)
            keys |= _loop_arg_names(text)
            keys |= set(re.findall(r'"--([a-z0-9_]+)"', text))  # names in tuples a loop registers
            for m in re.finditer(r"aliases\s*=\s*\[([^\]]*)\]", text):
                keys |= set(re.findall(r'"--([\w]+)"', m.group(1)))
            for m in re.finditer(r'name\s*=\s*"(\w+)",\s*arg_name\s*=\s*None', text):
                ignored.add(m.group(1))
    cli = (root / "simpletuner" / "helpers" / "configuration" / "cli_utils.py").read_text(encoding="utf-8")
    keys |= set(re.findall(r'@_legacy_handler\("(\w+)"\)', cli))
    cmd = (root / "simpletuner" / "helpers" / "configuration" / "cmd_args.py").read_text(encoding="utf-8")
    if "--ignore_final_epochs" in cmd:
        keys.add("ignore_final_epochs")
    return {"": keys, "ignored": ignored - keys}


def _loop_arg_names(text: str) -> set[str]:
    """``for a, name, b in ((…, "x", …), …): … arg_name=f"--{name}"`` -> {"x", …} (AST, names only)."""
    out: set[str] = set()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For) or not isinstance(loop.iter, (ast.Tuple, ast.List)):
            continue
        targets = [t.id for t in loop.target.elts] if isinstance(loop.target, ast.Tuple) else (
            [loop.target.id] if isinstance(loop.target, ast.Name) else [])
        used = set()
        for n in ast.walk(loop):
            if isinstance(n, ast.JoinedStr) and n.values and _str(n.values[0]) == "--":
                used |= {v.value.id for v in n.values[1:] if isinstance(v, ast.FormattedValue)
                         and isinstance(v.value, ast.Name)}
        for var in used & set(targets):
            i = targets.index(var)
            for item in loop.iter.elts:
                elts = item.elts if isinstance(item, ast.Tuple) else [item]
                if i < len(elts) and _str(elts[i]):
                    out.add(_str(elts[i]).lstrip("-"))
    return out


GENERATORS = {"kohya": kohya, "kohya-gui": kohya_gui, "ai-toolkit": ai_toolkit, "onetrainer": onetrainer,
              "simpletuner": simpletuner}
HEADERS = {
    "kohya": "sd-scripts option names (argparse dest) of every add_argument in library/*.py and the top-level *train*.py.\n"
             "TOML keys given to --config_file must be one of these; read_config_from_file (library/train_util.py)\n"
             "accepts any key silently.",
    "kohya-gui": "kohya_ss GUI saved-configuration keys: the parameters of save_configuration() per tab (minus the\n"
                 "SaveConfigFile exclusion), one section per tab; [legacy]: keys update_my_data migrates. The GUI\n"
                 "ignores keys it does not know.",
    "ai-toolkit": "ai-toolkit job-YAML keys: kwargs.get/pop keys of each config class in toolkit/config_modules.py per\n"
                  "section of config.process[N]; [process]: get_conf keys of the process classes; [slider]: the slider\n"
                  "config classes. The classes ignore other keys silently.",
    "onetrainer": "OneTrainer TrainConfig keys (names only, AGPL code not copied): TrainConfig.default_values() [top],\n"
                  "TrainModelPartConfig.default_values() [part]; [legacy]: keys its config migrations consume, with the\n"
                  "__version below which that migration runs. BaseConfig.from_dict ignores other keys silently.",
    "simpletuner": "SimpleTuner option names (names only, AGPL code not copied): arg_name/aliases of the field registry\n"
                   "(loops expanded) and the legacy keys its config loader forwards; [ignored]: registry fields with\n"
                   "arg_name=None (dropped before argparse). argparse rejects other keys.",
}


def render(trainer: str, sections: dict[str, set[str]], commit: str) -> str:
    head = "\n".join(f"# {line}" for line in HEADERS[trainer].splitlines())
    lines = [f"# Generated by `python tools/gen_audit_keys.py {trainer} CHECKOUT --write` from {repo_of(trainer)}@{commit}.",
             head]
    for name in sorted(sections, key=lambda s: (s != "", s)):
        if name:
            lines.append(f"[{name}]")
        lines += sorted(sections[name])
    return "\n".join(lines) + "\n"


#: Config languages whose key table their own reader module generates (``_main(CHECKOUT [--write])``).
READER_GENERATORS = ("musubi", "diffusion-pipe")


def repo_of(name: str) -> str:
    """The repository a config language's keys come from (the trainer registry)."""
    sys.path.insert(0, str(ROOT))
    from te_align.trainers import dialect

    d, spec = dialect(name)
    return spec.dialect_repo(d)


def reader_module(name: str) -> str:
    """The module path of a config language's reader (the trainer registry)."""
    sys.path.insert(0, str(ROOT))
    from te_align.trainers import dialect

    d, spec = dialect(name)
    return spec.module_path(d.module)


# --------------------------------------------------------------------------- argparse option tables
def _kohya_scripts(root: Path) -> list[tuple[str, Path, Path, str]]:
    sys.path.insert(0, str(ROOT))
    from te_align.trainers.kohya.names import SCRIPTS

    names = [*SCRIPTS, "tools/cache_latents.py", "tools/cache_text_encoder_outputs.py"]
    return [(n, root, root / n, n[:-3].replace("/", ".")) for n in names]


def _musubi_scripts(root: Path) -> list[tuple[str, Path, Path, str]]:
    sys.path.insert(0, str(ROOT))
    from te_align.trainers.musubi.audit import scripts

    src = root / "src"
    return [(n, src, src / "musubi_tuner" / n, "musubi_tuner." + n[:-3]) for n in scripts(root)]


def _diffusers_scripts(root: Path) -> list[tuple[str, Path, Path, str]]:
    sys.path.insert(0, str(ROOT))
    from te_align.trainers.diffusers_examples.audit import SCRIPTS

    return [(n, root / s.folder, root / s.folder / n, n[:-3]) for n, s in SCRIPTS.items()]


#: name -> (the scripts of a checkout: section, module folder, file, module name; the trainer package; the repo)
OPTION_TABLES = {
    "kohya-options": (_kohya_scripts, "kohya", "kohya-ss/sd-scripts"),
    "musubi-options": (_musubi_scripts, "musubi", "kohya-ss/musubi-tuner"),
    "diffusers-examples-options": (_diffusers_scripts, "diffusers_examples", "huggingface/diffusers"),
}


def option_table(name: str, root: Path, commit: str) -> str:
    """The text of ``te_align/trainers/<package>/data/<name>.txt`` read from a checkout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from argparse_options import render_section, script_options

    scripts, _, repo = OPTION_TABLES[name]
    lines = [f"# Generated by `python tools/gen_audit_keys.py {name} CHECKOUT --write` from {repo}@{commit}.",
             "# Each script's argparse parser as its main block builds it (tools/argparse_options.py): one section per",
             "# script, its option strings in the order argparse registers them, `> dest` where the dest is not the",
             "# default, `!allow_abbrev false` where abbreviations are off. argparse reads a unique prefix of an option",
             "# string as that option and refuses a prefix several start with."]
    for section, package_dir, path, module in scripts(root):
        lines += render_section(section, script_options(package_dir, path, module))
    return "\n".join(lines) + "\n"


def _option_main(args_in: list[str]) -> int:
    ap = argparse.ArgumentParser(description="argparse option tables")
    ap.add_argument("table", choices=sorted(OPTION_TABLES))
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--commit")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(args_in)
    text = option_table(args.table, args.checkout, _commit(args.checkout, args.commit))
    target = ROOT / "te_align" / "trainers" / OPTION_TABLES[args.table][1] / "data" / f"{args.table}.txt"
    if args.write:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in and args_in[0] in OPTION_TABLES:
        return _option_main(args_in)
    if args_in and args_in[0] in READER_GENERATORS:
        import importlib

        return importlib.import_module(reader_module(args_in[0]))._main(args_in[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trainer", choices=sorted([*GENERATORS, *READER_GENERATORS]))
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--commit", help="the checkout's commit when it is not a git work tree")
    ap.add_argument("--write", action="store_true", help="write te_align/trainers/<package>/data/<trainer>.txt")
    args = ap.parse_args(args_in)
    sections = GENERATORS[args.trainer](args.checkout)
    text = render(args.trainer, sections, _commit(args.checkout, args.commit))
    from te_align.trainers import dialect

    target = ROOT / "te_align" / "trainers" / dialect(args.trainer)[1].package / "data" / f"{args.trainer}.txt"
    if args.write:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target} ({sum(len(v) for v in sections.values())} keys)")
        return 0
    old = {ln.split("#", 1)[0].strip() for ln in target.read_text(encoding="utf-8").splitlines()} if target.exists() else set()
    new = {ln.strip() for ln in text.splitlines() if not ln.startswith("#")}
    sys.stdout.write(text)
    print(f"# +{len(new - old - {''})} -{len(old - new - {''})} lines against {target.name}", file=sys.stderr)
    for ln in sorted(old - new - {""}):
        print(f"#   - {ln}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
