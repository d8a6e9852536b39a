"""``te-align check --fix`` for diffusion-pipe: a ``[model]`` key of the training TOML (a top-level one such as
``uncond_fraction`` at the top), or ``caption_prefix``
in the dataset TOML it names (utils/dataset.py reads it per ``[[directory]]``, else from the dataset's top
level): set in every directory that has one and at the top level when it is there, else added at the top
level."""

from __future__ import annotations

from te_align.audit.findings import Edit
from te_align.audit.readers import RawConfig
from te_align.fixing.editing import CannotFix, Change, require_known
from te_align.trainers.diffusion_pipe.audit import _dataset, valid_keys


def place(raw: RawConfig, edit: Edit, extra_args: list[str]) -> list[Change]:
    data = raw.data if isinstance(raw.data, dict) else {}
    if edit.key != "caption_prefix" and edit.key in valid_keys()["top"] and edit.key not in valid_keys()["model"]:
        return [Change(raw.file, "toml", (edit.key,), edit.value, edit.remove, edit.key)]  # uncond_fraction
    if edit.key != "caption_prefix":
        require_known(edit.key, valid_keys()["model"], raw.file, "diffusion-pipe")
        return [Change(raw.file, "toml", ("model", edit.key), edit.value, edit.remove, f"model.{edit.key}")]
    dataset, file = _dataset(data.get("dataset"), raw.file)
    if dataset is None or file is None:
        raise CannotFix(f"the dataset TOML ({data.get('dataset')!r}) is not found; caption_prefix goes there",
                        file=raw.file, key=edit.key)
    dirs = dataset.get("directory") if isinstance(dataset.get("directory"), list) else []
    paths: list[tuple[str | int, ...]] = [("directory", i, "caption_prefix") for i, d in enumerate(dirs)
                                          if isinstance(d, dict) and "caption_prefix" in d]
    if "caption_prefix" in dataset or not paths:
        paths.append(("caption_prefix",))
    if edit.remove:
        paths = [p for p in paths if len(p) > 1 or "caption_prefix" in dataset]
    return [Change(file, "toml", p, edit.value, edit.remove, "caption_prefix") for p in paths]
