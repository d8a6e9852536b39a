"""``te-align check --fix`` for musubi-tuner: a flag of the training or caching command line, or a key of a
``--config_file`` TOML (read flattened, as sd-scripts does)."""

from __future__ import annotations

from te_align.audit.editing import Change, flag_or_flat_toml_changes
from te_align.audit.findings import Edit
from te_align.audit.parsed import parse_cli
from te_align.audit.readers import RawConfig


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    return flag_or_flat_toml_changes(raw, edit.key, edit.value, edit.remove, extra_args, parse_cli)
