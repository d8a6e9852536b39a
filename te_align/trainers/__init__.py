"""What te-align knows about each third-party trainer's model names: one small table per trainer.

Each module maps the trainer's own architecture / script / config names to te-align's bundled
profiles (and so to ``profile.family``, the one name te-align uses for "which model"). The trainer's
names appear only here; ``te-align check`` (:mod:`te_align.audit`), the runtime hooks
(:mod:`te_align.hooks`), on-disk patching (:mod:`te_align.patching`) and the probe all read them.

Plain data and small functions over it: standard library only, no torch, no other te-align module,
so the torch-free audit and the hooks can both import it without depending on each other.
"""
