"""Drop-in patches: a trainer's entry scripts replaced by te-align drop-ins that activate its hooks and then run
the original, kept byte for byte under :data:`ORIGINALS` (the ``patch`` part of a trainer folder uses these).

:func:`plan_drop_ins` makes the plan (refusing a dirty tree and a drop-in without its manifest; a tree patched
before keeps the original its manifest recorded); :func:`target_problems` checks hook targets in the source
without importing it (for a commit te-align was not verified against). No trainer is named here.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from te_align._git import git_dir
from te_align.hooks.base import OFF_WORDS
from te_align.patching.trainers import Detection
from te_align.patching.transaction import (
    STATE_DIR,
    FileChange,
    PatchError,
    Plan,
    read_manifest,
    sha256_bytes,
    sha256_file,
)

#: The folder (in the patched tree) that keeps the originals of the replaced scripts.
ORIGINALS = "te_align_originals"


def shim_from_template(template: Path, script: str, profile: str | None, *, unpinned: str = "profile chosen per run",
                       **fields: str) -> bytes:
    """A drop-in for ``script`` from a trainer's ``str.format`` template: the original's path under
    :data:`ORIGINALS`, the profile pinned when one is given (else ``pass  # unpinned``), te-align's off words and
    any further ``fields``."""
    text = template.read_text(encoding="utf-8")
    pin = f'_te_os.environ.setdefault("TE_ALIGN_PROFILE", {profile!r})' if profile else f"pass  # {unpinned}"
    return text.format(script=script, original=f"{ORIGINALS}/{script}", pin=pin, off_words=OFF_WORDS,
                       **fields).encode("utf-8")


# ------------------------------------------------------------------------------ static contract
def _module_file(root: Path, module: str) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _find_def(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The (last) definition of ``qualname`` (``Class.method`` through nested classes) in ``tree``."""
    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for part in parts[:-1]:
        cls: ast.ClassDef | None = None
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name == part:
                cls = node
        if cls is None:
            return None
        body = cls.body
    found: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == parts[-1]:
            found = node
    return found


def _parse(f: Path) -> ast.Module | None:
    try:
        st = f.stat()
    except OSError:
        return None
    return _parse_cached(str(f), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _parse_cached(path: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
        return None


def target_problems(root: Path, targets: Iterable[Any]) -> list[str]:
    """Which hook ``targets`` (module, qualname, pinned params) are missing or changed in the tree at ``root``,
    read from the source files without importing them."""
    problems: list[str] = []
    trees: dict[str, ast.Module | None] = {}
    for t in targets:
        if t.module not in trees:
            trees[t.module] = _parse(_module_file(root, t.module))
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
        )
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
DROP_IN_MARK = b"# te-align drop-in"


def _restore_hint(root: Path, script: str, name: str) -> str:
    """How to get an original script back: git only where the tree is a git checkout."""
    if git_dir(root) is not None:
        return f"restore the original with: git -C {root} checkout -- {script}"
    kept = root / ORIGINALS / script
    if kept.is_file() and not kept.read_bytes().startswith(DROP_IN_MARK):
        return f"restore the original te-align kept with: cp {kept} {root / script}"
    return f"restore the original {script} from a fresh copy of {name}"


def _original_for(
    root: Path, state: Path, script: str, entry: dict[str, Any], orig_entry: dict[str, Any] | None, cur_bytes: bytes | None
) -> bytes:
    """The original of a script patched before: the saved one (or the user's edit of the copy in
    te_align_originals/), or the script's new upstream bytes when something other than te-align
    replaced the drop-in (e.g. git pull)."""
    orig_rel = f"{ORIGINALS}/{script}"
    backup = (state / entry["backup"]).read_bytes() if entry.get("backup") else None
    orig_now = (root / orig_rel).read_bytes() if (root / orig_rel).is_file() else None
    orig_edited = (
        orig_entry is not None and orig_now is not None and sha256_bytes(orig_now) != orig_entry["patched_sha256"]
        and not orig_now.startswith(DROP_IN_MARK)
    )
    ours = cur_bytes is None or sha256_bytes(cur_bytes) == entry["patched_sha256"] or cur_bytes.startswith(DROP_IN_MARK)
    if ours:  # te-align's drop-in (maybe edited by the user: --replan writes a fresh one)
        original = orig_now if orig_edited else backup
    elif orig_edited:
        raise PatchError(
            f"both {root / script} and {root / orig_rel} changed since te-align patched them; keep the one you want "
            f"(copy it over {root / script}), then run: te-align unpatch {root} --keep-changed and patch again"
        )
    else:
        original = cur_bytes
    if original is None:
        raise PatchError(f"te-align state file is unreadable (no backup of {script}); restore {script} by hand, then delete {state}",
                         file=str(state / "manifest.json"))
    return original


def plan_drop_ins(
    detection: Detection,
    profile: str | None,
    *,
    trainer: str,
    name: str,
    scripts: tuple[tuple[str, str], ...],
    shim: Callable[[str, str | None], bytes],
    readme: str,
) -> Plan:
    """The plan that replaces each of ``scripts`` (path, what it trains) present in the tree by a drop-in
    (``shim(script, profile)``) and keeps the original byte for byte under ``ORIGINALS``.

    Refuses a dirty tree and a drop-in without its manifest; a tree patched before keeps the original its
    manifest recorded, so that unpatch gives back what git had. ``name``: the trainer as users call it.
    """
    root = detection.root
    manifest = read_manifest(root) or {}
    known = manifest.get("files", {}) if manifest.get("trainer") in (None, trainer) else {}
    present = [(s, what) for s, what in scripts if (root / s).is_file() or s in known]
    dirty = _dirty(root, {*known})
    if dirty:
        shown = ", ".join(dirty[:8]) + (f" and {len(dirty) - 8} more" if len(dirty) > 8 else "")
        raise PatchError(
            f"{root} has uncommitted changes ({shown}); te-align patches only a clean checkout so that unpatch "
            f"gives back exactly what git has. Commit or stash them first (git -C {root} stash), then patch again"
        )
    changes: list[FileChange] = []
    state = root / STATE_DIR
    for script, what in present:
        current = root / script
        orig_rel = f"{ORIGINALS}/{script}"
        cur_bytes = current.read_bytes() if current.is_file() else None
        cur_sha = sha256_bytes(cur_bytes) if cur_bytes is not None else None
        entry = known.get(script)
        restore_to = None
        if entry is not None:  # patched before: find the original unpatch must give back
            original = _original_for(root, state, script, entry, known.get(orig_rel), cur_bytes)
            restore_to = original
        elif cur_bytes is None:
            raise PatchError(f"{current} is missing; restore it from {name}, then patch again")
        elif cur_bytes.startswith(DROP_IN_MARK):
            raise PatchError(
                f"{current} is a te-align drop-in but {state} holds no manifest for it (was {STATE_DIR} deleted?); "
                f"{_restore_hint(root, script, name)}, then patch again"
            )
        else:
            original = cur_bytes
        changes.append(FileChange(script, shim(script, profile), cur_sha, note=f"drop-in ({what}); original kept in {orig_rel}",
                                  restore_to=restore_to))
        changes.append(FileChange(orig_rel, original, sha256_file(root / orig_rel), note=f"original {script}, unchanged", original_of=script))
    changes.append(FileChange(f"{ORIGINALS}/README.txt", readme.encode(), sha256_file(root / ORIGINALS / "README.txt")))
    changes.append(FileChange(f"{ORIGINALS}/.gitignore", b"*\n", sha256_file(root / ORIGINALS / ".gitignore")))
    digest = hashlib.sha256(b"".join(c.content for c in changes)).hexdigest()[:12]
    return Plan(
        root, trainer, detection.version, tuple(changes), profile=profile,
        extra={"layout": detection.layout, "scripts": [s for s, _ in present], "plan_sha256": digest},
    )


__all__ = ["DROP_IN_MARK", "ORIGINALS", "plan_drop_ins", "target_problems"]
