"""``te-align check --fix`` for musubi-tuner: a flag of the training or caching command line, or a key of a
``--config_file`` TOML (read flattened, as sd-scripts does)."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.parsed import parse_cli, script_options
from te_align.audit.readers import RawConfig
from te_align.fixing.editing import Change, flag_or_flat_toml_changes, with_spellings


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    changes = flag_or_flat_toml_changes(raw, edit.key, edit.value, edit.remove, extra_args, parse_cli)
    script = raw.data.get("script") if isinstance(raw.data, dict) else None
    return with_spellings(raw, changes, script_options("te_align.trainers.musubi", "musubi-options", str(script or "")))
