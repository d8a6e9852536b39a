"""``te-align check --fix`` for kohya_ss GUI JSON: a key the GUI has a field for is written into that field (a
removed flag becomes the field's default, as the GUI saves it); any other sd-scripts flag goes into
``additional_parameters``, which the GUI appends to the command line it runs."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig, known_keys
from te_align.fixing.editing import CannotFix, Change, flag_words, require_known
from te_align.trainers.kohya.audit import parse_cli
from te_align.trainers.kohya.audit_gui import GUI_FIELDS

#: What the GUI saves in a field when its flag is not given (the fixes' "remove": lora_gui.py defaults).
GUI_DEFAULTS: dict[str, object] = {"clip_skip": 1, "max_token_length": 75, "apply_t5_attn_mask": False,
                                   "caption_dropout_every_n_epochs": 0, "shuffle_caption": False}


def _default(key: str) -> object:
    if key.endswith("dropout_rate"):
        return 0
    return GUI_DEFAULTS.get(key, "")


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    data = raw.data if isinstance(raw.data, dict) else {}
    if edit.key in parse_cli(extra_args)[0]:
        raise CannotFix("given on the command line after `--`: change it there", file=raw.file, key=edit.key)
    field = GUI_FIELDS.get(edit.key, ("", ()))[0]
    if field and field in data:
        value = _default(edit.key) if edit.remove else edit.value
        old = data[field]
        if isinstance(old, str) and not isinstance(value, str):  # the GUI saved this field as text
            value = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        return [Change(raw.file, "json", (field,), value, False, edit.key)]
    require_known(edit.key, known_keys("kohya", "te_align.trainers.kohya")[""], raw.file, "sd-scripts")
    extra = data.get("additional_parameters", "")
    if not isinstance(extra, str):
        raise CannotFix("additional_parameters is not a string", file=raw.file, key=edit.key)
    new = flag_words(extra, edit.key, edit.value, edit.remove)
    if new == extra or (edit.remove and f"{edit.key}" not in extra.replace("-", "_")):
        return []
    return [Change(raw.file, "json", ("additional_parameters",), new, False, "additional_parameters "
                                                                             f"--{edit.key}")]
