"""Type-check ``te_align`` with mypy and hold every file to its committed error count (CI's gate, ``.ci/run``).

Maintainer script::

    python tools/mypy_baseline.py [--update] [--baseline FILE]

Runs ``python -m mypy`` with the configuration in ``pyproject.toml`` (``[tool.mypy]``: strict flags on
``te_align.trainers.api``, ``te_align.profiles``, ``te_align.probe``, ``te_align.patching``, ``te_align.audit``,
``te_align.fixing``, ``te_align.parts`` and ``te_align.checking``, mypy's defaults elsewhere), counts the errors of each file and compares them with ``tools/mypy_baseline.txt``. A file whose count
rises, or that has errors and is not listed, fails the check (exit 1): a strict module is never listed, so its count
is held at 0. A count that falls passes and is printed; ``--update`` then writes the lower counts (and, after new
code, the current ones) to the baseline. Prints the whole package's count and the count per subpackage.

Exit 0: no file above its baseline; 1: some file above; 2: mypy is not installed or did not run (a configuration
error, a crash).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "tools" / "mypy_baseline.txt"
#: One error line of mypy's default output: ``te_align/x.py:12: error: message  [code]``.
_ERROR = re.compile(r"^(?P<file>[^:\s]+\.pyi?):\d+(?::\d+)?: error: ")
_HEADER = (
    "# mypy errors per file of te_align (python tools/mypy_baseline.py --update writes this file).\n"
    "# A file's count may fall, never rise; a file not listed has 0 (the strict modules are never listed).\n"
    "# Format: COUNT PATH, one file a line, sorted by path.\n"
)


def run_mypy() -> tuple[Counter[str], str]:
    """(errors per file, mypy's last line) for the package, with pyproject.toml's configuration."""
    try:
        import mypy  # noqa: F401
    except ImportError:
        sys.exit("mypy is not installed: pip install -c lock/constraints.txt -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-color-output", "--no-pretty"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stdout + proc.stderr)
        print(f"mypy did not run (exit {proc.returncode}); see above", file=sys.stderr)
        sys.exit(2)
    counts: Counter[str] = Counter()
    for line in proc.stdout.splitlines():
        m = _ERROR.match(line)
        if m:
            counts[m["file"].replace("\\", "/")] += 1
    if proc.returncode == 1 and not counts:
        sys.stderr.write(proc.stdout + proc.stderr)
        print("mypy failed without an error line of a file; see above", file=sys.stderr)
        sys.exit(2)
    lines = proc.stdout.strip().splitlines()
    return counts, lines[-1] if lines else ""


def read_baseline(path: Path) -> dict[str, int]:
    """``path``'s counts (file -> errors); a malformed line is one clear error (exit 2)."""
    counts: dict[str, int] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        count, _, file = line.strip().partition(" ")
        if not count.isdigit() or not file:
            sys.exit(f"{path}:{n}: expected 'COUNT PATH', got {line!r}")
        counts[file] = int(count)
    return counts


def write_baseline(path: Path, counts: Counter[str]) -> None:
    body = "".join(f"{counts[f]} {f}\n" for f in sorted(counts) if counts[f])
    path.write_text(_HEADER + body, encoding="utf-8")


def by_package(counts: Counter[str]) -> Counter[str]:
    """Errors per first-level part of ``te_align`` (``te_align/ab``, ``te_align/_toml.py``)."""
    out: Counter[str] = Counter()
    for file, n in counts.items():
        parts = file.split("/")
        out["/".join(parts[:2])] += n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="write the current counts to the baseline")
    ap.add_argument("--baseline", type=Path, default=BASELINE, help="the baseline file (default: %(default)s)")
    args = ap.parse_args(argv)
    counts, summary = run_mypy()
    total = sum(counts.values())
    print(f"mypy: {total} errors in {len(counts)} files of te_align ({summary or 'no summary'})")
    for part, n in sorted(by_package(counts).items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d} {part}")
    if args.update:
        write_baseline(args.baseline, counts)
        print(f"wrote {args.baseline}")
        return 0
    if not args.baseline.is_file():
        print(f"no baseline at {args.baseline}: run python tools/mypy_baseline.py --update", file=sys.stderr)
        return 2
    base = read_baseline(args.baseline)
    risen = sorted(f for f in counts if counts[f] > base.get(f, 0))
    fallen = sorted(f for f in base if counts.get(f, 0) < base[f])
    for f in fallen:
        print(f"fell: {f} {base[f]} -> {counts.get(f, 0)} (lower the baseline: python tools/mypy_baseline.py --update)")
    if risen:
        for f in risen:
            print(f"ROSE: {f} {base.get(f, 0)} -> {counts[f]} (run python -m mypy to see the errors)")
        print(f"mypy baseline: FAILED, {len(risen)} file(s) above their count in {args.baseline.name}")
        return 1
    print(f"mypy baseline: ok (baseline total {sum(base.values())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
