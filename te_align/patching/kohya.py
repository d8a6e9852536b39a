"""On-disk patch of kohya sd-scripts (bare checkout or the kohya_ss GUI's ``sd-scripts`` submodule).

Plan: every train script that exists (``train_network.py``, ``sdxl_train_network.py``, …, and the
full fine-tunes) is replaced by a drop-in (template ``patches/kohya/train_script.py.tmpl``) that
activates :mod:`te_align.hooks.kohya` and then runs the original code, kept byte for byte as
``te_align_originals/<script>``. The GUI's ``accelerate launch sd-scripts/<script> --config_file …``
keeps working. Version: the git HEAD (submodule ``.git`` files are followed); a commit te-align was
not verified against is accepted only when every hook target is present with the expected
parameters, checked statically (the source is parsed, nothing is imported).
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import subprocess
from pathlib import Path

from te_align._git import git_dir, git_head
from te_align.hooks.base import OFF_WORDS
from te_align.patching.templates import patch_dir
from te_align.patching.trainers import Detection
from te_align.patching.transaction import STATE_DIR, FileChange, PatchError, Plan, read_manifest, sha256_file
from te_align.trainers import kohya as kohya_table

TRAINER = "kohya"
ORIGINALS = "te_align_originals"
#: Scripts that get a drop-in, with the architecture they train (LoRA first, then full fine-tunes).
SCRIPTS: tuple[tuple[str, str], ...] = kohya_table.drop_in_scripts()


def templates_dir() -> Path:
    return patch_dir("kohya")


# ------------------------------------------------------------------------------------ detection
def _is_sd_scripts(p: Path) -> bool:
    return (p / "library" / "strategy_base.py").is_file() and (p / "train_network.py").is_file()


def detect(path: Path) -> Detection | None:
    """A kohya_ss GUI folder (root = its sd-scripts submodule) or a bare sd-scripts checkout; else None."""
    path = Path(path)
    sub = path / "sd-scripts"
    gui = (path / "kohya_gui").is_dir() or (path / "kohya_gui.py").is_file()
    if gui and sub.is_dir():
        if not _is_sd_scripts(sub):
            raise PatchError(
                f"{path} is a kohya_ss GUI folder but its sd-scripts submodule is empty or incomplete; "
                f"run: git -C {path} submodule update --init --recursive"
            )
        root, layout = sub, "kohya_ss GUI"
    elif _is_sd_scripts(path):
        root, layout = path, "sd-scripts checkout"
    else:
        return None
    version, notes = _version(root)
    if layout == "kohya_ss GUI":
        notes = (f"the GUI launches sd-scripts/<script>; patching {root}", *notes)
    return Detection(TRAINER, root, layout, version, notes)


def _version(root: Path) -> tuple[str, tuple[str, ...]]:
    from te_align.hooks.kohya import KohyaHook

    head = git_head(root)
    if head is None:
        return "unknown (no git)", ("not a git checkout: the hook targets are checked in the source instead",)
    if head in KohyaHook.supported:
        return head[:7], ()
    return head[:7], (f"commit {head[:7]} is not one te-align was verified with ({', '.join(c[:7] for c in KohyaHook.supported)}); hook targets are checked in the source",)


# ------------------------------------------------------------------------------ static contract
def _module_file(root: Path, module: str) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _find_def(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found = None
        for node in body:
            if last and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part:
                found = node
            elif not last and isinstance(node, ast.ClassDef) and node.name == part:
                found = node
        if found is None:
            return None
        if last:
            return found  # type: ignore[return-value]
        body = found.body  # type: ignore[union-attr]
    return None


def static_problems(root: Path) -> list[str]:
    """Hook targets that are missing or whose parameters changed, read from the source (no import)."""
    from te_align.hooks.kohya import all_targets

    problems: list[str] = []
    trees: dict[str, ast.Module | None] = {}
    for t in all_targets():
        if t.module not in trees:
            f = _module_file(root, t.module)
            try:
                trees[t.module] = ast.parse(f.read_text(encoding="utf-8"), str(f))
            except (OSError, SyntaxError, UnicodeDecodeError):
                trees[t.module] = None
        tree = trees[t.module]
        if tree is None:
            problems.append(f"{t.label}: module file {_module_file(root, t.module).relative_to(root)} missing or unreadable")
            continue
        node = _find_def(tree, t.qualname)
        if node is None:
            problems.append(f"{t.label}: not found")
            continue
        args = node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        want = list(t.params or ())
        n_defaults = len(args.defaults)
        without_default = names[: len(names) - n_defaults]
        if names[: len(want)] != want or len(without_default) > len(want):
            problems.append(f"{t.label}: signature changed: expected ({', '.join(want)}), found ({', '.join(names)})")
    return problems


# ------------------------------------------------------------------------------------ dirty tree
def _dirty(root: Path, ours: set[str]) -> list[str]:
    """Tracked files with uncommitted changes (git status), not counting te-align's own."""
    if git_dir(root) is None or shutil.which("git") is None:
        return []
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    paths = []
    for line in out.stdout.splitlines():
        rel = line[3:].split(" -> ")[-1].strip().strip('"')
        if rel and rel not in ours and not rel.startswith((ORIGINALS + "/", STATE_DIR + "/")):
            paths.append(rel)
    return paths


# ------------------------------------------------------------------------------------------ plan
def shim_source(script: str, profile: str | None) -> bytes:
    template = (templates_dir() / "train_script.py.tmpl").read_text(encoding="utf-8")
    pin = f'_te_os.environ.setdefault("TE_ALIGN_PROFILE", {profile!r})' if profile else "pass  # profile chosen per run"
    return template.format(script=script, original=f"{ORIGINALS}/{script}", pin=pin, off_words=OFF_WORDS).encode("utf-8")


def plan(detection: Detection, profile: str | None) -> Plan:
    from te_align.hooks.kohya import KohyaHook

    root = detection.root
    problems = static_problems(root)
    if problems:
        commit = next(iter(KohyaHook.supported))[:7]
        raise PatchError(
            f"unknown sd-scripts version {detection.version} at {root}: te-align's hook targets do not match "
            f"({'; '.join(problems)}). te-align was verified with sd-scripts {commit}; check that commit out "
            f"(git -C {root} checkout {commit}) or upgrade te-align"
        )
    manifest = read_manifest(root) or {}
    known = manifest.get("files", {}) if manifest.get("trainer") in (None, TRAINER) else {}
    present = [(s, a) for s, a in SCRIPTS if (root / s).is_file() or s in known]
    dirty = _dirty(root, {*known})
    if dirty:
        shown = ", ".join(dirty[:8]) + (f" and {len(dirty) - 8} more" if len(dirty) > 8 else "")
        raise PatchError(
            f"{root} has uncommitted changes ({shown}); te-align patches only a clean checkout so that unpatch "
            f"gives back exactly what git has. Commit or stash them first (git -C {root} stash), then patch again"
        )
    changes: list[FileChange] = []
    for script, arch in present:
        current = root / script
        entry = known.get(script)
        cur_sha = sha256_file(current)
        if entry is not None and cur_sha == entry.get("patched_sha256") and entry.get("backup"):
            original = (root / STATE_DIR / entry["backup"]).read_bytes()  # ours: the original is in the backup
        else:
            original = current.read_bytes()
        if original.startswith(b"# te-align drop-in"):
            raise PatchError(f"{current} is a te-align drop-in without a te-align manifest; restore it with git -C {root} checkout -- {script}")
        changes.append(FileChange(script, shim_source(script, profile), cur_sha, note=f"drop-in ({arch}); original kept in {ORIGINALS}/{script}"))
        orig_rel = f"{ORIGINALS}/{script}"
        changes.append(FileChange(orig_rel, original, sha256_file(root / orig_rel), note=f"original {script}, unchanged"))
    readme = (
        "Original sd-scripts train scripts, kept byte for byte by te-align; the scripts of the same name one\n"
        f"folder up run them after activating te-align. Undo everything with: te-align unpatch {root}\n"
    ).encode()
    changes.append(FileChange(f"{ORIGINALS}/README.txt", readme, sha256_file(root / ORIGINALS / "README.txt")))
    changes.append(FileChange(f"{ORIGINALS}/.gitignore", b"*\n", sha256_file(root / ORIGINALS / ".gitignore")))
    digest = hashlib.sha256(b"".join(c.content for c in changes)).hexdigest()[:12]
    return Plan(
        root, TRAINER, detection.version, tuple(changes), profile=profile,
        extra={"layout": detection.layout, "scripts": [s for s, _ in present], "plan_sha256": digest},
    )  # fmt: skip


__all__ = ["ORIGINALS", "SCRIPTS", "detect", "plan", "shim_source", "static_problems"]
