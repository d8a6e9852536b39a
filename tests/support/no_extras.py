"""Run the te-align CLI as in a Python where only the core is installed: every library of te-align's extras
(``te_align._extras.PROVIDED``) fails to import, as it does where it is not installed.

    python tests/support/no_extras.py check examples/kohya/sdxl_typo.toml
    python tests/support/no_extras.py -c "import te_align; te_align.encode('sd15', 'a cat')"
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from te_align._extras import PROVIDED


class _NotInstalled:
    """A meta-path finder that answers every import of an extra's library as Python does for a missing one."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in PROVIDED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, _NotInstalled())
for loaded in [m for m in sys.modules if m.split(".")[0] in PROVIDED]:
    del sys.modules[loaded]

if __name__ == "__main__":
    if sys.argv[1:2] == ["-c"]:
        exec(compile(sys.argv[2], "<-c>", "exec"), {"__name__": "__main__"})
        sys.exit(0)
    from te_align.cli import main

    sys.exit(main(sys.argv[1:]))
