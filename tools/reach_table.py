"""Print the README's trainer × family table of what ``te-align check`` covers (``--write`` puts it in README.md).

The table is made from the trainers' own rule tables (te_align.audit.reach), so it cannot drift from the code:
tests/audit/test_reach.py fails when README.md holds another one. Usage: python tools/reach_table.py [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's te_align, installed or not
BEGIN = "<!-- reach table: python tools/reach_table.py --write -->"
END = "<!-- end of reach table -->"


def table() -> str:
    from te_align.audit.models import community_bases
    from te_align.audit.reach import markdown_table
    from te_align.commands.profile import reach_cells
    from te_align.profiles import profiles

    labels: dict[str, list[str]] = {}
    community = community_bases()
    for p in profiles():  # a community base is checked by its architecture's rules: named, not described
        labels.setdefault(p.family, []).append(f"community base {p.name}" if p.name in community else p.display_name)
    return markdown_table(reach_cells(), {f: ", ".join(names) for f, names in labels.items()})


def readme_with(text: str, readme: str) -> str:
    head, sep, rest = readme.partition(BEGIN)
    if not sep:
        raise SystemExit(f"README.md has no line {BEGIN!r}")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise SystemExit(f"README.md has no line {END!r} after the table's start")
    return f"{head}{BEGIN}\n{text}{END}{tail}"


def main(argv: list[str]) -> int:
    text = table()
    if argv == ["--write"]:
        path = ROOT / "README.md"
        path.write_text(readme_with(text, path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if argv:
        print("usage: python tools/reach_table.py [--write]", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
