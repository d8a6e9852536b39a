"""``te-align check --fix`` for a diffusers example script's command line (``accelerate launch train_*.py …``
in a .sh/.bat/.txt file): the flag is set, added or removed in the file, continuations kept."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.parsed import script_options
from te_align.audit.readers import RawConfig
from te_align.fixing.editing import Change, flag_changes, with_spellings


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    changes = flag_changes(raw, edit.key, edit.value, edit.remove, extra_args)
    script = raw.data.get("script") if isinstance(raw.data, dict) else None
    return with_spellings(raw, changes, script_options("te_align.trainers.diffusers_examples",
                                                       "diffusers-examples-options", str(script or "")))
