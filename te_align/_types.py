"""Type aliases for shapes that recur across te_align (no runtime cost: nothing here imports torch).

- :data:`JSONValue` / :data:`JSONObject`: what ``json.loads``, ``tomllib.load`` and a YAML safe load
  give back (TOML's dates and YAML's timestamps included) and what te_align writes as JSON: trainer
  configs, reports, run logs. Code that reads one narrows with ``isinstance`` before use.
- :data:`StrPath`: a path argument given as text or a path object.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | _dt.date | _dt.datetime | _dt.time | None
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"
StrPath: TypeAlias = str | os.PathLike[str]
