"""``te-align check --fix`` for OneTrainer JSON: a top-level key, or ``PART.KEY`` inside the ``PART`` object
(``text_encoder_2.train``)."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig, known_keys
from te_align.fixing.editing import Change, require_known


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    valid = known_keys("onetrainer", "te_align.trainers.onetrainer")
    part, dot, sub = edit.key.partition(".")
    if dot:
        require_known(sub, valid["part"], raw.file, "OneTrainer")
        return [Change(raw.file, "json", (part, sub), edit.value, edit.remove, edit.key)]
    require_known(edit.key, valid["top"], raw.file, "OneTrainer")
    return [Change(raw.file, "json", (edit.key,), edit.value, edit.remove, edit.key)]
