"""``te-align check --fix`` for SimpleTuner ``config.json`` / ``config.toml``: flat keys, written as the file
spells them (with or without the leading ``--``); a new key takes the spelling most of the file's keys
have."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig, known_keys
from te_align.fixing.editing import CannotFix, Change, require_known


def _name(k: object) -> str:
    return str(k).lstrip("-").replace("-", "_")


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    if raw.fmt == "env":
        raise CannotFix("a config.env: set it by hand (its variable, or a word of TRAINER_EXTRA_ARGS)", file=raw.file,
                        key=edit.key)
    data = raw.data if isinstance(raw.data, dict) else {}
    keys = known_keys("simpletuner", "te_align.trainers.simpletuner")
    require_known(edit.key, keys[""] | keys.get("ignored", frozenset()), raw.file, "SimpleTuner")
    spelled = [str(k) for k in data if _name(k) == edit.key]
    if edit.remove or spelled:
        return [Change(raw.file, raw.fmt, (k,), edit.value, edit.remove, k) for k in spelled]
    dashed = sum(str(k).startswith("--") for k in data) * 2 > len(data)
    key = f"--{edit.key}" if dashed else edit.key
    return [Change(raw.file, raw.fmt, (key,), edit.value, False, key)]
