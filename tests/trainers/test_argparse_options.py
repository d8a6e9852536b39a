"""Each script's argparse options (``te_align/trainers/<name>/data/*-options.txt``): generated from the trainers' own
parsers by ``tools/gen_audit_keys.py`` (``tools/argparse_options.py`` reads the source), and read by ``check`` the way
argparse reads a prefix. The regeneration tests run where a checkout is given (``TE_ALIGN_KOHYA_DIR``,
``TE_ALIGN_MUSUBI_DIR``, ``TE_ALIGN_DIFFUSERS_EXAMPLES_DIR``) and skip naming the variable otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_align.audit.parsed import ScriptOptions, option_tables, script_options

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

TABLES = {
    # table: (trainer package, env var, what the checkout is)
    "kohya-options": ("kohya", "TE_ALIGN_KOHYA_DIR", "a kohya-ss/sd-scripts checkout"),
    "musubi-options": ("musubi", "TE_ALIGN_MUSUBI_DIR", "a kohya-ss/musubi-tuner checkout"),
    "diffusers-examples-options": ("diffusers_examples", "TE_ALIGN_DIFFUSERS_EXAMPLES_DIR",
                                   "a huggingface/diffusers checkout with examples/"),
}


def bundled(table: str) -> str:
    return (ROOT / "te_align" / "trainers" / TABLES[table][0] / "data" / f"{table}.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("table", sorted(TABLES))
def test_table_is_generated_from_the_checkout(table):
    """The bundled table is exactly what the maintainer command reads from the checkout at the commit it names."""
    _, env, what = TABLES[table]
    root = os.environ.get(env)
    if not root:
        pytest.skip(f"{env} is not set (path of {what})")
    text = bundled(table)
    commit = text.splitlines()[0].rsplit("@", 1)[1].rstrip(".")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_audit_keys.py"), table, root, "--commit", commit],
                         capture_output=True, text=True, check=True).stdout
    assert out == text


def test_tables_have_every_script_te_align_reads():
    from te_align.trainers.diffusers_examples.audit import SCRIPTS as DIFFUSERS
    from te_align.trainers.kohya.names import SCRIPTS as KOHYA
    from te_align.trainers.musubi.audit import valid_keys

    kohya = option_tables("te_align.trainers.kohya", "kohya-options")
    assert set(kohya) == {*KOHYA, "tools/cache_latents.py", "tools/cache_text_encoder_outputs.py"}
    musubi = option_tables("te_align.trainers.musubi", "musubi-options")
    assert {k[:-3] for k in musubi} == {k for k in valid_keys() if not k.startswith("dataset")}
    assert set(option_tables("te_align.trainers.diffusers_examples", "diffusers-examples-options")) == set(DIFFUSERS)
    # the same option names as the key tables the unknown-key check uses (argparse's -h/--help aside)
    for section, keys in valid_keys().items():
        if section.startswith("dataset"):
            continue
        opts = musubi[section + ".py"]
        names = {s[2:] for s in opts.strings if s.startswith("--")} - {"help"}
        assert names | set(opts.dests.values()) - {"help"} == set(keys), section


def test_table_order_dests_and_help():
    flux = script_options("te_align.trainers.kohya", "kohya-options", "sd-scripts/flux_train_network.py")
    assert flux is not None and flux.allow_abbrev
    assert flux.strings[:3] == ("-h", "--help", "--console_log_level")
    assert flux.dests["--help"] == "help"
    assert len(flux.strings) == 217  # 216 actions, -h/--help one of them
    assert script_options("te_align.trainers.kohya", "kohya-options", "train_lora.py") is None
    assert script_options("te_align.trainers.kohya", "kohya-options", "tools\\cache_latents.py") is not None
    hidream = script_options("te_align.trainers.musubi", "musubi-options", "hidream_o1_train.py")
    assert hidream is not None and hidream.dests["--dino_loss_no_norm"] == "dino_loss_use_norm"


def test_resolve_is_argparses_prefix_rule():
    opts = ScriptOptions(("-h", "--help", "--learning_rate", "--learning_rate_te1", "--learning_rate_te2", "--t5xxl"),
                         {"-h": "help", "--help": "help", "--learning_rate": "learning_rate",
                          "--learning_rate_te1": "learning_rate_te1", "--learning_rate_te2": "learning_rate_te2",
                          "--t5xxl": "t5xxl"})
    assert opts.resolve("--learning_rate") == ("--learning_rate", [])  # exact beats the longer options it starts
    assert opts.resolve("--learning_rate_te") == (None, ["--learning_rate_te1", "--learning_rate_te2"])
    assert opts.resolve("--learning") == (None, ["--learning_rate", "--learning_rate_te1", "--learning_rate_te2"])
    assert opts.resolve("--t5") == ("--t5xxl", [])
    assert opts.resolve("--he") == ("--help", [])
    assert opts.resolve("--t5xxl_max") == (None, [])
    off = ScriptOptions(opts.strings, opts.dests, allow_abbrev=False)
    assert off.resolve("--t5") == (None, [])
    assert off.resolve("--t5xxl") == ("--t5xxl", [])


def test_reader_follows_calls_and_conditions(tmp_path):
    """The source reader on a small checkout: a library function whose options depend on a literal argument, a
    parser made in another module, allow_abbrev off, and a condition it cannot work out refused by file and line."""
    from argparse_options import Inexact
    from argparse_options import script_options as read

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "util.py").write_text(
        "def add_common(parser, with_db: bool, extra=None):\n"
        "    parser.add_argument('--seed', type=int)\n"
        "    if with_db:\n"
        "        parser.add_argument('--reg_data_dir')\n"
        "    else:\n"
        "        parser.add_argument('--in_json')\n"
        "    if extra is not None:\n"
        "        parser.add_argument(extra)\n"
        "    g = parser.add_argument_group('x')\n"
        "    g.add_argument('--no_half', '--no-half-vae', dest='half', action='store_false')\n")
    (tmp_path / "base.py").write_text(
        "import argparse\nfrom lib import util\n"
        "def setup_parser():\n    p = argparse.ArgumentParser(allow_abbrev=False)\n"
        "    util.add_common(p, True)\n    return p\n")
    (tmp_path / "train.py").write_text(
        "import base\nimport lib.util as u\n"
        "def setup_parser():\n    parser = base.setup_parser()\n    parser.add_argument('--t5xxl')\n    return parser\n"
        "if __name__ == '__main__':\n    parser = setup_parser()\n    args = parser.parse_args()\n"
        "    parser.add_argument('--after')\n")
    p = read(tmp_path, tmp_path / "train.py", "train")
    assert p.allow_abbrev is False
    assert p.actions == [(("-h", "--help"), "help"), (("--seed",), "seed"), (("--reg_data_dir",), "reg_data_dir"),
                         (("--no_half", "--no-half-vae"), "half"), (("--t5xxl",), "t5xxl")]
    (tmp_path / "odd.py").write_text(
        "import argparse, os\n"
        "if __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n"
        "    if os.environ.get('X'):\n        parser.add_argument('--x')\n    parser.parse_args()\n")
    with pytest.raises(Inexact, match=r"odd\.py:4: `if os\.environ\.get\('X'\)` decides parser code"):
        read(tmp_path, tmp_path / "odd.py", "odd")
