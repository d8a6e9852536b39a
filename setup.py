"""Build hook: ship the repository's presets/ folder inside the wheel as te_align/_presets (the name
te_align._shipped.SHIPPED reads; tests/repo/test_repo.py builds a wheel and checks). The trainers' drop-in templates
are package data of their folders (te_align/trainers/<trainer>/templates).

All project metadata lives in pyproject.toml; this file only extends setuptools' build_py.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("presets",)  # = te_align._shipped.SHIPPED (setup.py cannot import the package)


class BuildPyWithShippedFolders(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for name in SHIPPED:
            src = root / name
            if src.is_dir():
                dst = Path(self.build_lib) / "te_align" / f"_{name}"
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithShippedFolders})
