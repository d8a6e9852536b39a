"""``te-align check --fix`` for musubi-tuner: a flag of the training or caching command line, or a key of a
``--config_file`` TOML (read flattened, as sd-scripts does)."""

from __future__ import annotations

from te_align.audit.editing import CannotFix, Change, flag_changes, flat_changes
from te_align.audit.findings import Edit
from te_align.audit.parsed import parse_cli
from te_align.audit.readers import RawConfig


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    if raw.fmt == "cmdline":
        data = raw.data if isinstance(raw.data, dict) else {}
        given = parse_cli([str(w) for w in data.get("args", [])])[0]  # type: ignore[union-attr]
        if edit.remove and edit.key not in given and given.get("config_file"):
            raise CannotFix(f"set in --config_file {given['config_file']}: remove it there", file=raw.file,
                            key=edit.key)
        return flag_changes(raw, edit.key, edit.value, edit.remove, extra_args)
    if edit.key in parse_cli(extra_args)[0]:
        raise CannotFix("given on the command line after `--`, which overrides the TOML: change it there",
                        file=raw.file, key=edit.key)
    return flat_changes(raw.file, "toml", raw.data, edit.key, edit.value, edit.remove)
