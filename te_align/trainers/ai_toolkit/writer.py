"""``te-align check --fix`` for ai-toolkit job YAML: ``model.KEY`` / ``train.KEY`` are keys of the job's
``config.process[0]`` sections (the process te-align checks)."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig, known_keys
from te_align.fixing.editing import CannotFix, Change, require_known


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    section, dot, name = edit.key.partition(".")
    if not dot or "[" in section:
        raise CannotFix("--fix has no place for this key in a job YAML", file=raw.file, key=edit.key)
    require_known(name, known_keys("ai-toolkit", "te_align.trainers.ai_toolkit").get(section, frozenset()), raw.file, "ai-toolkit")
    path = ("config", "process", 0, section, name)
    return [Change(raw.file, "yaml", path, edit.value, edit.remove, edit.key)]
