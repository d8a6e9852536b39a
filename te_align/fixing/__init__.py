"""``te-align check --fix``: writing a checked config, outside the read-only lint engine (:mod:`te_align.audit`).

:mod:`te_align.fixing.editing` turns a finding's fix (an :class:`~te_align.audit.findings.Edit`, placed by the
trainer's :class:`~te_align.trainers.api.ConfigWriter` as :class:`~te_align.fixing.editing.Change` values) into
new text, keeping every other byte; :mod:`te_align.fixing.fix` checks the new text and writes it under the locks of
:mod:`te_align.patching.journal`. Importing this package imports neither (tomlkit and ruamel.yaml load only
when a fix is made). No torch.
"""
