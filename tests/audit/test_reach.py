"""What check covers, trainer × family: made from the trainers' rule tables, shown by `profile list` and the README."""

from __future__ import annotations

import json
import types
from pathlib import Path

from te_align.audit.reach import Cell, family_cells, markdown_table
from te_align.audit.rules import Rule
from te_align.cli import main
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> types.ModuleType:
    return load_script("tools/reach_table.py")


def test_the_readme_table_is_the_one_the_rule_tables_make():
    tool = _tool()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert tool.readme_with(tool.table(), readme) == readme, "README's trainer × family table is stale: python tools/reach_table.py --write"


def test_a_family_is_checked_by_rules_naming_it_not_by_rules_for_every_family():
    dialect = types.ModuleType("dialect")
    dialect.SUPPORTED = ("flux", "sdxl", "anima")  # type: ignore[attr-defined]
    dialect.NOT_CHECKED = {"anima": "its text encoding runs in a submodule te-align does not read"}  # type: ignore[attr-defined]
    dialect.RULES = (  # type: ignore[attr-defined]
        Rule("t5.tokenizer.max_length", ("flux-dev",), "t5_max", 512, "T5 length", "x.py:1"),
        Rule("t5.tokenizer.max_length", ("flux",), "t5_max", 512, "T5 length", "x.py:2"),
        Rule("clip_l.train_dropout", ("*",), "dropout", 0.0, "dropout", "x.py:3"),
    )
    families = {"flux": ["flux-dev", "flux-schnell"], "sdxl": ["sdxl"], "anima": ["anima"], "sana": ["sana"]}
    cells = family_cells("t", dialect, families)
    assert cells == [
        Cell("t", "flux", "rules", 2),
        Cell("t", "sdxl", "not-checked", 0, "no rules yet"),
        Cell("t", "anima", "not-checked", 0, "its text encoding runs in a submodule te-align does not read"),
        Cell("t", "sana", "not-trained"),
    ]
    assert markdown_table(cells, {"flux": "FLUX.1", "sdxl": "SDXL", "anima": "Anima", "sana": "Sana"}) == (
        "| family | t |\n| --- | --- |\n| FLUX.1 | ✓ 2 |\n| SDXL | not checked (1) |\n| Anima | not checked (2) |\n"
        "| Sana | — |\n\n(1) t: no rules yet\n(2) t: its text encoding runs in a submodule te-align does not read\n")


def test_profile_list_names_the_trainers_each_profile_is_checked_for(capsys):
    assert main(["profile", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["qwen-image"]["checked_for"] == ["ai-toolkit", "simpletuner", "onetrainer", "diffusers-examples", "musubi",
                                                 "diffusion-pipe"]  # diffusers: train_dreambooth_lora_qwen_image.py
    assert rows["anima"]["checked_for"] == ["kohya"]
    assert {"trainer": "diffusion-pipe", "why": "no rules yet"} in rows["anima"]["not_checked_for"]
