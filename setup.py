"""Build hook: ship the repository's patches/ folder inside the wheel as te_align/_patches.

All project metadata lives in pyproject.toml; this file only extends setuptools' build_py.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPatches(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).resolve().parent / "patches"
        if src.is_dir():
            dst = Path(self.build_lib) / "te_align" / "_patches"
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithPatches})
