"""``te-align check --fix`` for sd-scripts ``--config_file`` TOMLs: sd-scripts flattens every table into its
argument namespace (library/train_util.py:4700-4764), so a key is set where it is (every table that has it)
and a new one goes to the top level, or into the first table of a file that has only tables."""

from __future__ import annotations

from te_align.audit.editing import CannotFix, Change, flag_changes, flat_changes, require_known
from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig, known_keys
from te_align.trainers.kohya.audit import parse_cli


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    if raw.fmt == "cmdline":  # a flag of the command line (accelerate launch flux_train_network.py …)
        data = raw.data if isinstance(raw.data, dict) else {}
        given = parse_cli([str(w) for w in data.get("args", [])])[0]  # type: ignore[union-attr]
        if edit.remove and edit.key not in given and given.get("config_file"):
            raise CannotFix(f"set in --config_file {given['config_file']}: remove it there", file=raw.file,
                            key=edit.key)
        return flag_changes(raw, edit.key, edit.value, edit.remove, extra_args)
    if edit.key in parse_cli(extra_args)[0]:
        raise CannotFix("given on the command line after `--`, which overrides the TOML: change it there",
                        file=raw.file, key=edit.key)
    require_known(edit.key, known_keys("kohya")[""], raw.file, "sd-scripts")
    return flat_changes(raw.file, "toml", raw.data, edit.key, edit.value, edit.remove)
