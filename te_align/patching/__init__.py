"""On-disk patching of trainer installations as transactions (plan, backup, atomic write, manifest, revert)."""

from te_align.patching.transaction import (
    ApplyResult,
    FileChange,
    FileState,
    PatchError,
    Plan,
    Status,
    apply,
    read_manifest,
    recover,
    revert,
    sha256_bytes,
    sha256_file,
    status,
)

__all__ = [
    "ApplyResult",
    "FileChange",
    "FileState",
    "PatchError",
    "Plan",
    "Status",
    "apply",
    "read_manifest",
    "recover",
    "revert",
    "sha256_bytes",
    "sha256_file",
    "status",
]
