"""Runtime hooks into trainers (one module or package per trainer); the shared machinery is in ``base``."""

from te_align.hooks.base import ENV_SWITCH, OFF_WORDS, Hook, HookError, Target, hooks_disabled

__all__ = ["ENV_SWITCH", "OFF_WORDS", "Hook", "HookError", "Target", "hooks_disabled"]
