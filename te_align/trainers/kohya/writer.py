"""``te-align check --fix`` for sd-scripts ``--config_file`` TOMLs: sd-scripts flattens every table into its
argument namespace (library/train_util.py:4700-4764), so a key is set where it is (every table that has it)
and a new one goes to the top level, or into the first table of a file that has only tables."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.parsed import script_options
from te_align.audit.readers import RawConfig, known_keys
from te_align.fixing.editing import Change, flag_or_flat_toml_changes, require_known, with_spellings
from te_align.trainers.kohya.audit import OPTIONS, parse_cli


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    """A flag of the command line (accelerate launch flux_train_network.py …) or a key of the TOML."""
    changes = flag_or_flat_toml_changes(
        raw, edit.key, edit.value, edit.remove, extra_args, parse_cli,
        known=lambda: require_known(edit.key, known_keys("kohya", "te_align.trainers.kohya")[""], raw.file, "sd-scripts"))
    script = raw.data.get("script") if isinstance(raw.data, dict) else None
    return with_spellings(raw, changes, script_options("te_align.trainers.kohya", OPTIONS, str(script or "")))
