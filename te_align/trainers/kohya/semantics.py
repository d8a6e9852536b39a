"""sd-scripts keys whose meaning on the text side is not what their name suggests (``effect`` findings): epoch-wise
caption dropout, and text-encoder learning-rate keys the script never reads.

Every fact was read at kohya-ss/sd-scripts@48d368fa557731ad0488c07304dfeba8c07910eb; sources are file:line there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from te_align.audit.findings import Edit, Finding, Severity

EVERY_N_SOURCE = ("sd-scripts: library/train_util.py:829-837 (process_caption: a caption becomes \"\" when "
                  "current_epoch % caption_dropout_every_n_epochs == 0); train_network.py:1401-1403 (the epoch number "
                  "counts from 1); library/config_util.py:203-207,430-433 (a subset, dataset or [general] key, else "
                  "the command line's)")
CACHED_SOURCE = ("sd-scripts: library/train_util.py:1697-1718 (with cached outputs __getitem__ does not call "
                 "process_caption), :1297-1351 (the cache encodes each caption as written), :1102-1113 (the "
                 "cacheability check looks at caption_dropout_rate, shuffle_caption, token_warmup_step and "
                 "caption_tag_dropout_rate, not at caption_dropout_every_n_epochs)")

#: Text-encoder learning-rate keys of sd-scripts and the scripts whose argparse defines and reads them.
LR_KEYS = ("text_encoder_lr", "learning_rate_te", "learning_rate_te1", "learning_rate_te2", "learning_rate_te3")

#: The network (LoRA) scripts: setup_parser of train_network.py (text_encoder_lr, :1764-1770), read at
#: train_network.py:732-746; a text-encoder LoRA without text_encoder_lr trains at learning_rate
#: (networks/lora.py:1196-1200; the same in networks/lora_flux.py, lora_sd3.py, lora_lumina.py, lora_anima.py).
NETWORK_SCRIPTS = frozenset({
    "train_network.py", "sdxl_train_network.py", "sd3_train_network.py", "flux_train_network.py",
    "lumina_train_network.py", "anima_train_network.py", "hunyuan_image_train_network.py",
})

#: script -> (the text-encoder LR keys it reads, the flag that turns text-encoder training on (None: the script's
#: own rule), where). Scripts absent here and not network scripts never train a text encoder.
FULL_SCRIPTS: dict[str, tuple[tuple[str, ...], str | None, str]] = {
    "fine_tune.py": (("learning_rate_te",), "train_text_encoder",
                     "fine_tune.py:195,221-228 (learning_rate_te only with train_text_encoder; unset: learning_rate)"),
    "train_db.py": (("learning_rate_te",), None,
                    "train_db.py:172,189-197 (the text encoder trains unless stop_text_encoder_training < 0; "
                    "learning_rate_te unset: learning_rate)"),
    "sdxl_train.py": (("learning_rate_te1", "learning_rate_te2"), "train_text_encoder",
                      "sdxl_train.py:293-300,355-359 (learning_rate_te1/2 only with train_text_encoder; unset: "
                      "learning_rate)"),
    "sd3_train.py": (("learning_rate_te1", "learning_rate_te2", "learning_rate_te3"), "train_text_encoder",
                     "sd3_train.py:238-248,412-422 (learning_rate_te1/2/3 only with train_text_encoder; unset: "
                     "learning_rate)"),
}
#: Train scripts with no text-encoder learning rate and no text-encoder training at all (their argparse and
#: optimizer take only the DiT / U-Net or the embeddings).
NO_TE_SCRIPTS = {
    "flux_train.py": "its optimizer takes only the FLUX DiT",
    "lumina_train.py": "its optimizer takes only the Lumina DiT",
    "anima_train.py": "its optimizer takes only the Anima DiT",
    "train_textual_inversion.py": "it trains the new token embeddings only",
    "sdxl_train_textual_inversion.py": "it trains the new token embeddings only",
}


#: Where each of those scripts builds its optimizer's parameter groups.
NO_TE_LINES = {"flux_train.py": "314-319", "lumina_train.py": "344-350", "anima_train.py": "270-283",
               "train_textual_inversion.py": "", "sdxl_train_textual_inversion.py": ""}


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f == int(f) else None


def epoch_dropout_findings(values: dict[str, Any], subsets: list[tuple[str, Any, bool]],
                           line: Callable[[str], int | None], cached_untrained: bool,
                           fix_off: Callable[[str], str] | None = None) -> list[Finding]:
    """``caption_dropout_every_n_epochs``: every caption of a subset is dropped in every epoch whose number is a
    multiple of N. ``subsets``: (where, value, from the dataset_config) of every subset. ``cached_untrained``: text
    encoder outputs are cached and no text encoder is trained, so no caption is ever dropped."""
    key = "caption_dropout_every_n_epochs"
    out: list[Finding] = []
    by_value: dict[int, list[tuple[str, bool]]] = {}
    for where, v, in_dataset in subsets:
        n = _int(v)
        if n is not None and n > 0:
            by_value.setdefault(n, []).append((where, in_dataset))
    for n, places in sorted(by_value.items()):
        in_file = [w for w, d in places if d]
        here = not in_file and key in values
        where = (f" (dataset_config subsets: {', '.join(in_file)})" if in_file else "")
        fix_words = (f"set {key} = 0 in the dataset_config for {', '.join(in_file)}" if in_file
                     else fix_off(key) if fix_off is not None else f"remove {key}")
        if cached_untrained:
            out.append(Finding(
                kind="unused-value", severity="warning", setting=key, effective=n, key=key,
                line=line(key) if here else None,
                message=(f"{key} = {n}{where} with cached text-encoder outputs: no caption is ever dropped, because "
                         "the cache holds each caption's outputs as written and training reads them without "
                         "process_caption (and sd-scripts, which refuses caption_dropout_rate with a cache, accepts "
                         "this key)"),
                fix=f"{fix_words}, or turn text-encoder output caching off",
                trainer_source=CACHED_SOURCE, edit=Edit(key, remove=True) if here else None))
            continue
        epochs = _int(values.get("max_train_epochs"))
        if n == 1:
            out.append(Finding(
                kind="effect", severity="error", setting=key, effective=n, key=key, line=line(key) if here else None,
                message=(f"{key} = 1{where}: sd-scripts drops every caption in every epoch whose number is a "
                         "multiple of N, so with 1 every caption of every epoch becomes the empty caption \"\": the "
                         "run trains unconditionally and learns nothing from your captions"),
                fix=f"{fix_words} (for random dropout of a share of captions use caption_dropout_rate, e.g. 0.05)",
                trainer_source=EVERY_N_SOURCE, edit=Edit(key, remove=True) if here else None))
        else:
            span = ""
            if epochs is not None and epochs > 0:
                span = (f"; with max_train_epochs = {epochs} that is {epochs // n} of {epochs} epochs" if n <= epochs
                        else f"; with max_train_epochs = {epochs} that never happens")
            out.append(Finding(
                kind="effect", severity="info", setting=key, effective=n, key=key, line=line(key) if here else None,
                message=(f"{key} = {n}{where}: every caption is dropped in epochs {n}, {2 * n}, … (whole epochs "
                         f"trained unconditionally on \"\", not a random share of captions in each){span}"),
                fix=f"keep it if whole unconditional epochs are meant; for per-caption dropout use caption_dropout_rate "
                    f"(about {1 / n:.2g}) and {fix_words}",
                trainer_source=EVERY_N_SOURCE))
    return out


def _set(values: dict[str, Any], key: str) -> bool:
    v = values.get(key)
    return v is not None and v != [] and v != ""


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _script_of(values: dict[str, Any], script: str | None) -> tuple[str | None, str]:
    """The script a config runs, and how te-align knows: the one named, else a network script where the config sets
    network_module (only they read it)."""
    name = script.rsplit("/", 1)[-1] if isinstance(script, str) else None
    if name is not None:
        return name, name
    if _set(values, "network_module"):
        return "train_network.py", "the network scripts (train_network.py and the *_train_network.py on it: the config sets network_module)"
    return None, ""


def _te_training(values: dict[str, Any], name: str) -> tuple[tuple[str, ...], bool, str, str, str] | None:
    """(the text-encoder LR keys the script reads, whether it trains a text encoder, why not, how to turn it on,
    where) or None for a script te-align has no facts for."""
    if name in NETWORK_SCRIPTS:
        return (("text_encoder_lr",), not _truthy(values.get("network_train_unet_only")),
                "network_train_unet_only is set", "leave out network_train_unet_only",
                "train_network.py:221-222,732-746; networks/lora.py:1196-1200")
    if name in FULL_SCRIPTS:
        reads, flag, where = FULL_SCRIPTS[name]
        if flag is None:
            stop = _int(values.get("stop_text_encoder_training"))
            return (reads, stop is None or stop >= 0, "stop_text_encoder_training is below 0",
                    "leave out stop_text_encoder_training", where)
        return reads, _truthy(values.get(flag)), f"{flag} is not set", f"set {flag} = true", where
    if name in NO_TE_SCRIPTS:
        return (), False, "", "", (f"{name}:{NO_TE_LINES[name]}" if NO_TE_LINES.get(name) else name) + (
            f" ({NO_TE_SCRIPTS[name]}; its argparse has no text-encoder learning rate)")
    return None


def trains_te(values: dict[str, Any], script: str | None) -> bool:
    """Whether the run trains a text encoder (unknown script: train_text_encoder, or a network config without
    network_train_unet_only)."""
    name, _ = _script_of(values, script)
    facts = _te_training(values, name) if name is not None else None
    if facts is None:
        return _truthy(values.get("train_text_encoder"))
    return facts[1]


def lr_findings(values: dict[str, Any], script: str | None, line: Callable[[str], int | None],
                cli_keys: set[str]) -> list[Finding]:
    """Text-encoder learning-rate keys the script never reads: the text encoder trains at another rate than the
    config says (or not at all). A key given on the command line to a script whose argparse lacks it stops the run
    at start (``parse_args``: unrecognized arguments). No script known: nothing is said."""
    given = [k for k in LR_KEYS if _set(values, k)]
    name, how = _script_of(values, script)
    facts = _te_training(values, name) if given and name is not None else None
    if facts is None or name is None:
        return []
    reads, trained, off, undo, where = facts
    rate = ""
    if trained:
        got = [k for k in reads if _set(values, k)]
        rate = (", ".join(f"{k} = {values[k]}" for k in got) if got
                else f"learning_rate{_shown(values, 'learning_rate')}")
    out: list[Finding] = []
    for key in given:
        if key in reads and trained:
            continue
        source = f"sd-scripts: {where}" if where else "sd-scripts"
        if key in cli_keys and key not in reads and script is not None:
            out.append(Finding(
                kind="unknown-key", severity="error", setting=key, effective=values[key], key=key, line=line(key),
                message=(f"{how}'s argparse has no --{key}: it stops at start ('unrecognized arguments'), "
                         + (f"it reads {' / '.join(reads)}" if reads else "it trains no text encoder")),
                fix=f"remove --{key}" + (f" and give --{reads[0]}" if len(reads) == 1 else ""),
                trainer_source=f"{source}; {name} parse_args"))
            continue
        if not trained:
            why = (f"{how} does not train the text encoder: {off}" if off
                   else f"{how} trains no text encoder ({NO_TE_SCRIPTS.get(name, '')})")
            message = f"{key} = {values[key]} is not read: {why}, so no text encoder trains at this rate"
            fix, edit = f"remove {key}" + (f", or {undo} to train the text encoder" if undo else ""), \
                Edit(key, remove=True)
        else:
            message = (f"{key} = {values[key]} is not read by {how}, which read {' / '.join(reads)}: the text "
                       f"encoder trains at {rate}, not at {values[key]}")
            unset = tuple(k for k in reads if not _set(values, k))
            if unset:
                fix = ", ".join(f"{k} = {_plain(values[key])}" for k in unset) + f" in place of {key}"
                edit = Edit(key, remove=True, also=tuple((k, _plain(values[key])) for k in unset))
            else:
                fix, edit = f"remove {key} ({' / '.join(reads)} set)", Edit(key, remove=True)
        out.append(Finding(
            kind="unused-value", severity="warning", setting=key, effective=values[key], key=key,
            line=line(key),
            message=message, fix=fix, trainer_source=source, edit=edit))
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, list) and len(v) == 1:
        return v[0]
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _shown(values: dict[str, Any], key: str) -> str:
    return f" = {values[key]}" if _set(values, key) else " (its default)"


#: Families whose scripts stop at start when text-encoder outputs are cached and a subset changes its caption at
#: every step (DatasetGroup.is_text_encoder_output_cacheable, library/train_util.py:1102-1113): where each asserts it.
#: Anima's cache keeps caption_dropout_rate (cache_supports_dropout). lumina_train_network.py has no such check.
CACHE_ASSERT = {
    "sdxl": "sdxl_train_network.py:34-37; sdxl_train.py:205-208",
    "sd3": "sd3_train_network.py:48-51; sd3_train.py:193-196",
    "flux": "flux_train_network.py:65-68; flux_train.py:180-183",
    "chroma": "flux_train_network.py:65-68",
    "hunyuanimage": "hunyuan_image_train_network.py:347-350",
    "anima": "anima_train_network.py:53-56; anima_train.py:153-156 (caption_dropout_rate allowed: the cache keeps it)",
}
LUMINA_FULL_ASSERT = "lumina_train.py:187-190"
#: Caption changes made at every step, which a text-encoder cache cannot hold.
PER_STEP = ("caption_dropout_rate", "shuffle_caption", "token_warmup_step", "caption_tag_dropout_rate")


def _per_step_on(key: str, v: Any) -> bool:
    if key == "shuffle_caption":
        return _truthy(v)
    try:
        return float(v) > 0
    except (TypeError, ValueError):
        return False


def cache_caption_findings(family: str, script: str | None, values: dict[str, Any],
                           subsets: Callable[[str], list[tuple[str, Any, bool]]],
                           line: Callable[[str], int | None], cached_untrained: bool) -> list[Finding]:
    """With cached text-encoder outputs, a caption change made at every step (shuffle, warm-up, tag or caption
    dropout): the scripts that check it stop at start; lumina_train_network.py does not check and never applies it
    (the cache holds each caption as written). The config's own caption_dropout_rate in a checking script is the
    reader's older finding; this adds the rest."""
    name = script.rsplit("/", 1)[-1] if isinstance(script, str) else None
    asserts = CACHE_ASSERT.get(family) or (LUMINA_FULL_ASSERT if family == "lumina2" and name == "lumina_train.py"
                                           else None)
    silent = family == "lumina2" and asserts is None and cached_untrained
    if asserts is None and not silent:
        return []
    out: list[Finding] = []
    for key in PER_STEP:
        if key == "caption_dropout_rate" and (family == "anima" or (asserts is not None)):
            # anima's cache keeps the rate; a checking script's top-level rate is reported by the reader already
            places = [(w, v, d) for w, v, d in subsets(key) if d and family != "anima" and _per_step_on(key, v)]
        else:
            places = [(w, v, d) for w, v, d in subsets(key) if _per_step_on(key, v)]
        if not places:
            continue
        in_file = [w for w, _, d in places if d]
        here = any(not d for _, _, d in places) and key in values
        where = f" (dataset_config subsets: {', '.join(in_file)})" if in_file and not here else ""
        shown = places[0][1]
        if asserts is not None:  # the script stops at start
            severity: Severity = "error"
            said = (f"{key} = {_plain_show(shown)}{where} with cached text-encoder outputs: sd-scripts stops at "
                    "start ('when caching Text Encoder output, either caption_dropout_rate, shuffle_caption, "
                    "token_warmup_step or caption_tag_dropout_rate cannot be used')")
            source = f"sd-scripts: library/train_util.py:1102-1113; {asserts}"
        else:  # lumina_train_network.py: no such check, the setting silently does nothing
            severity = "warning"
            said = (f"{key} = {_plain_show(shown)}{where} with cached text-encoder outputs does nothing: "
                    "lumina_train_network.py does not check it (as the other scripts do) and the cache holds "
                    "each caption's outputs as written, read without process_caption")
            source = ("sd-scripts: lumina_train_network.py:39-50 (no cacheability check); "
                      f"{CACHED_SOURCE.removeprefix('sd-scripts: ')}")
        out.append(Finding(
            kind="unused-value", severity=severity, setting=key, effective=shown, key=key,
            line=line(key) if here else None, message=said,
            fix=f"turn {key} off{' in the dataset_config' if where else ''}, or turn text-encoder output caching off",
            trainer_source=source, edit=Edit(key, remove=True) if here else None))
    return out


def _plain_show(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)
