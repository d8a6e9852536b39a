"""Profiles from Hugging Face hub repos: the diffusers folder logic over the repo's small config files.

Only ``model_index.json`` and the JSON configs beside the weights are downloaded (:data:`HUB_PATTERNS`),
into the ordinary hub cache; ``HF_HUB_OFFLINE`` reads the cache only.
"""

from __future__ import annotations

import os
from pathlib import Path

from te_align.errors import ProfileError
from te_align.profiles.model import AlignmentProfile
from te_align.profiles.sources.common import BuildReport, log_report
from te_align.profiles.sources.folder import Tree, build_tree

#: The only files fetched from the hub: model_index.json and the small JSON configs beside the weights.
HUB_PATTERNS = (
    "model_index.json",
    "*/config.json",
    "scheduler/scheduler_config.json",
    "tokenizer*/tokenizer_config.json",
    "tokenizer*/special_tokens_map.json",
    "tokenizer*/added_tokens.json",
)


def from_hub(repo_id: str, revision: str | None = None) -> AlignmentProfile:
    """The profile of a hub repo, from its config files only (differences are logged once)."""
    report = build_hub(repo_id, revision)
    log_report(report)
    return report.profile


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _hub_cache_dir() -> str | None:
    """The hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.path.expandvars(os.environ[var]))
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.path.expandvars(os.environ["HF_HOME"])), "hub")
    return None


def _hub_offline() -> bool:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        flag = _env_flag(var)
        if flag is not None:
            return flag
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _download_hub(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover - a dependency of te-align
        raise ProfileError("reading hub repos needs the huggingface_hub package (pip install huggingface_hub)") from None
    offline = _hub_offline()
    cache_dir = _hub_cache_dir()
    shown_cache = cache_dir or constants.HF_HUB_CACHE
    where = f"hub repo '{repo_id}'" + (f" (revision {revision})" if revision else "")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            allow_patterns=list(HUB_PATTERNS),
            local_files_only=offline,
        )
    except GatedRepoError:
        raise ProfileError(
            f"{where} is gated: accept its licence on huggingface.co and log in (hf auth login or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ProfileError(f"{where} not found on the Hugging Face hub (or private and no token was given)") from None
    except RevisionNotFoundError:
        raise ProfileError(f"{where}: no such revision on the Hugging Face hub") from None
    except HFValidationError as e:
        raise ProfileError(f"'{repo_id}' is not a valid hub repo id: {_first_line(e)}") from None
    except LocalEntryNotFoundError:
        if offline:
            raise ProfileError(
                f"{where} is not in the Hugging Face cache ({shown_cache}) and HF_HUB_OFFLINE is set; "
                "run once with network access or pass a local model folder"
            ) from None
        raise ProfileError(
            f"{where}: the Hugging Face hub could not be reached and the repo is not in the cache ({shown_cache})"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise ProfileError(f"{where}: cannot download its config files: {_first_line(e)}") from None
    except Exception as e:  # network errors from the HTTP client huggingface_hub uses
        if type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests", "urllib3"):
            raise ProfileError(f"{where}: cannot download its config files: {_first_line(e)}") from None
        raise
    return Path(folder)


def _shown_cache() -> str:
    from huggingface_hub import constants

    return _hub_cache_dir() or constants.HF_HUB_CACHE


def offline_model_problem(repo_id: str, revision: str | None = None) -> str | None:
    """Why a whole hub model cannot load here, said before a library tries: offline (``HF_HUB_OFFLINE``) and the
    repo's ``model_index.json`` is not in the hub cache. None when it may load (online, or cached)."""
    if not _hub_offline():
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(repo_id, "model_index.json", cache_dir=_hub_cache_dir(), revision=revision)
    except Exception:  # an invalid repo id: let the loader report it
        return None
    if isinstance(hit, str):
        return None
    return (f"'{repo_id}' is a Hugging Face hub id, it is not in the local hub cache ({_shown_cache()}), and "
            f"HF_HUB_OFFLINE is set: download it once with network access (hf download {repo_id}), or set this "
            "key to a local diffusers folder or .safetensors file")


def unreachable_model_problem(repo_id: str, error: BaseException) -> str | None:
    """If ``error`` (from a library loading a hub model) means the hub could not be reached and the model is not
    cached, say so and what to do; otherwise None."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    network = any(type(x).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError",
                                       "ConnectionError", "ConnectTimeout", "NameResolutionError")
                  or "not fully cached locally" in str(x) or "outgoing traffic has been disabled" in str(x)
                  for x in chain)
    if not network:
        return None
    return (f"'{repo_id}' is a Hugging Face hub id; the hub could not be reached (offline?) and the model is not "
            f"fully in the local hub cache ({_shown_cache()}): download it once with network access "
            f"(hf download {repo_id}), or set this key to a local diffusers folder or .safetensors file")


def build_hub(repo_id: str, revision: str | None = None) -> BuildReport:
    """The build report of a hub repo (``revision``: a branch, tag or commit; default the main branch)."""
    folder = _download_hub(repo_id, revision)
    commit = folder.name
    shown = f"{repo_id}@{revision or commit[:12]}"
    tree = Tree(folder, f"{shown}/")
    if not tree.exists("model_index.json"):
        raise ProfileError(
            f"hub repo '{repo_id}' has no model_index.json: not a diffusers-format repo "
            "(for a single-file checkpoint, download the .safetensors file and pass its path)"
        )
    source = repo_id + (f"@{revision}" if revision else "")
    return build_tree(tree, kind="hub", source=source, hint=repo_id.split("/")[-1], repo=repo_id)

