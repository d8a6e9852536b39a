"""A/B preset trainings: a trainer's default conditioning (arm A) against the profile (arm B).

``te-align ab run PRESET`` / :func:`run_ab` trains both arms with :func:`te_align.train.train` on
identical data, seeds, steps and hyper-parameters, scores them with a deterministic validation loss,
measures how far their conditioning differs, renders samples and writes ``report.md`` and
``report.html``. ``te-align ab matrix`` / :func:`run_matrix` runs the pre-registered effects matrix on the shipped
world bases (:mod:`te_align.ab.matrix`; per-seed results, the table, the summary ``te-align check`` reads through
:mod:`te_align.ab.evidence`); ``te-align demo`` / :func:`run_demo` runs one of its rows live. Presets live in
``presets/`` (:mod:`te_align.ab.preset`). Submodules that need torch load on first use.
"""

from __future__ import annotations

from te_align._lazy import lazy_exports

_EXPORTS = {
    "ABError": "te_align.ab.preset",
    "Preset": "te_align.ab.preset",
    "list_presets": "te_align.ab.preset",
    "load_preset": "te_align.ab.preset",
    "ABResult": "te_align.ab.runner",
    "run_ab": "te_align.ab.runner",
    "run_demo": "te_align.ab.demo",
    "run_matrix": "te_align.ab.matrix",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
