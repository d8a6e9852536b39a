"""``te_align.swap``: replace a model's text encoder by a new one plus a trainable projection.

:func:`swap` reads as the steps it takes:

1. check the request (reset and statistics modes, the output folder, the family row in
   :data:`te_align.swap.families.FAMILIES`) before anything is loaded;
2. load the base pipeline and its profile, the new encoder and tokenizer, and check they fit (the
   denoiser's conditioning width, the tokenizer's vocabulary against the encoder's embedding table,
   a projection given to start from);
3. build the projected encoder (:class:`te_align.encoding.projected.ProjectedTextEncoder`) and the
   swapped profile (:func:`swapped_profile`);
4. measure the base model's conditioning statistics on the captions, measure the new encoder's, and set
   ``output_scale`` (and with ``shift``, ``output_shift``) so that they match; measure again;
5. re-initialise the denoiser layers of the reset mode, each by its own ``reset_parameters()``;
6. write the new diffusers folder into a temporary folder beside the target and rename it into place
   (a failure leaves no folder under the target name).

Random draws: ``torch.manual_seed(seed)``, then the projection's weight (``nn.Linear``'s own init; the
bias starts at zero), then every reset layer in ``named_modules()`` order. The global RNG state is
restored afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._atomic import fault_point, fsync_dir
from te_align._lazy import lazy_module
from te_align._types import JSONObject
from te_align.encoding.core import _config_width
from te_align.errors import TeAlignError, closest
from te_align.profiles.model import (
    AlignmentProfile,
    EncoderSpec,
    MaskSpec,
    Provenance,
    SlotSpec,
    TokenizerSpec,
)
from te_align.profiles.overrides import resolve
from te_align.profiles.resolve import MODEL_PROFILE_FILE
from te_align.swap.families import FAMILIES, RESET_MODES, SwapFamily
from te_align.swap.measure import STATS_MODES, Stats, measure
from te_align.train.config import ModelConfig
from te_align.train.models import load_pipeline

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from diffusers import DiffusionPipeline
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from te_align.encoding.projected import ProjectedTextEncoder

#: Deferred: it loads transformers, needed only once a swap builds its encoder.
_projected = lazy_module("te_align.encoding.projected")

#: The profile file a swapped model folder carries (te_align.profile(folder) reads it).
PROFILE_FILE = MODEL_PROFILE_FILE
#: What was done, as JSON, beside it.
REPORT_FILE = "te_align_swap.json"

#: A few captions for measuring when none are given: varied lengths, objects, colours and layouts.
DEFAULT_CAPTIONS = (
    "a photo of a cat",
    "a red square on a white background",
    "a watercolor painting of a lighthouse at dusk, soft light, waves",
    "two blue circles and a green triangle",
    "portrait of an old man with a grey beard, studio lighting, 85mm",
    "",
    "a city street at night in the rain, neon signs reflected in puddles, people with umbrellas",
    "a bowl of fruit",
)


class SwapError(TeAlignError):
    """A swap request that cannot be done (bad input, a mismatch between the parts)."""


@dataclass
class SwapReport:
    """What :func:`swap` did and measured."""

    #: The folder written (None: an in-memory swap).
    out: Path | None
    profile: AlignmentProfile
    target: Stats
    before: Stats
    after: Stats
    scale: list[float]
    shift: list[float]
    reset: str
    reset_layers: list[str] = field(default_factory=list)
    seed: int = 0

    def as_dict(self) -> JSONObject:
        return {
            "out": None if self.out is None else str(self.out),
            "profile": self.profile.name,
            "fingerprint": self.profile.fingerprint(),
            "stats": self.target.mode,
            "target": self.target.summary(),
            "before": self.before.summary(),
            "after": self.after.summary(),
            "scale": _compact(self.scale),
            "shift": _compact(self.shift),
            "reset": self.reset,
            "reset_layers": self.reset_layers,
            "seed": self.seed,
        }


def _compact(values: list[float]) -> float | list[float]:
    return values[0] if len(set(values)) == 1 else values


# ------------------------------------------------------------------------------------------ checks
def check_request(reset: str, stats: str, out: str | os.PathLike[str] | None) -> None:
    """Refuse an unknown mode or an existing output folder (before anything is loaded)."""
    if reset not in RESET_MODES:
        raise SwapError(
            f"unknown reset mode {reset!r}; expected one of {', '.join(RESET_MODES)}{closest(reset, RESET_MODES)}",
            key="--reset",
        )
    if stats not in STATS_MODES:
        raise SwapError(f"unknown statistics mode {stats!r}; expected one of {', '.join(STATS_MODES)}", key="--stats")
    if out is not None:
        target = Path(out).expanduser()
        if target.exists() or target.is_symlink():
            raise SwapError(
                "the output folder already exists; te-align swap writes a new folder and never replaces one "
                "(choose another path or remove it)",
                file=str(out),
            )
        if not target.parent.is_dir():
            raise SwapError("the output folder's parent folder does not exist", file=str(out))


def family_row(profile: AlignmentProfile) -> SwapFamily:
    row = FAMILIES.get(profile.family)
    if row is None or not row.supported:
        ready = ", ".join(f for f, r in FAMILIES.items() if r.supported)
        why = f" ({row.note})" if row is not None and row.note else ""
        raise SwapError(
            f"profile '{profile.name}' is a {profile.family} model; te-align swap supports {ready} so far{why}",
            key="--profile",
        )
    if row.slot not in profile.slot_names:
        raise SwapError(
            f"profile '{profile.name}' has no slot '{row.slot}' to replace (slots: {', '.join(profile.slot_names)})",
            key="--profile",
        )
    return row


def _width(config: object) -> int | None:
    return _config_width(config)


def check_parts(
    profile: AlignmentProfile, row: SwapFamily, denoiser: torch.nn.Module, encoder: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, where: Mapping[str, str]
) -> tuple[int, int]:
    """(input width, output width): the new encoder's width and the denoiser's, after checking that the
    denoiser takes what the old slot gives and that the tokenizer fits the encoder."""
    slot = profile.slot(row.slot)
    want = getattr(getattr(denoiser, "config", None), row.width_key, None)
    if not isinstance(want, int):
        raise SwapError(
            f"the {row.denoiser} config has no integer '{row.width_key}' (got {want!r})",
            file=where.get("denoiser"),
            key=row.width_key,
        )
    if want != slot.encoder.hidden_size:
        raise SwapError(
            f"the {row.denoiser} attends to width {want} but profile '{profile.name}' slot '{slot.name}' gives "
            f"{slot.encoder.hidden_size}: the base model does not match its profile",
            file=where.get("denoiser"),
            key=row.width_key,
        )
    width = _width(getattr(encoder, "config", None))
    if width is None or width <= 0:
        raise SwapError(
            "the new text encoder's config states no width (expected d_model or hidden_size)",
            file=where.get("encoder"),
            key="d_model",
        )
    if not callable(tokenizer) or not hasattr(tokenizer, "__len__"):
        raise SwapError(f"the tokenizer is a {type(tokenizer).__name__}, not a tokenizer", file=where.get("tokenizer"))
    vocab = getattr(encoder.config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise SwapError(
            f"the tokenizer has {len(tokenizer)} tokens but the encoder's vocab_size is {vocab}: ids past "
            f"{vocab - 1} would index past its embedding table; expected the tokenizer the encoder was "
            "trained with",
            file=where.get("tokenizer"),
            key="vocab_size",
        )
    if tokenizer.pad_token_id is None:
        raise SwapError(
            "the tokenizer has no pad token, and prompts are padded to a fixed length (expected pad_token)",
            file=where.get("tokenizer"),
            key="pad_token",
        )
    return width, want


def check_projection(weights: Mapping[str, torch.Tensor], in_width: int, out_width: int, *, file: str) -> None:
    """A projection to start from: ``weight`` (out, in) and an optional ``bias`` (out,)."""
    if "weight" not in weights:
        raise SwapError(f"no tensor 'weight' (found: {', '.join(sorted(weights)) or 'none'})", file=file, key="weight")
    w = tuple(weights["weight"].shape)
    if w != (out_width, in_width):
        raise SwapError(
            f"the projection weight has shape {w} but the new encoder's width is {in_width} and the denoiser "
            f"attends to {out_width}: expected ({out_width}, {in_width})",
            file=file,
            key="weight",
        )
    if "bias" in weights and tuple(weights["bias"].shape) != (out_width,):
        raise SwapError(
            f"the projection bias has shape {tuple(weights['bias'].shape)}; expected ({out_width},)",
            file=file,
            key="bias",
        )


# ------------------------------------------------------------------------------------------ profile
def _slot_name(encoder: PreTrainedModel, taken: Sequence[str]) -> str:
    model_type = str(getattr(encoder.config, "model_type", "") or "text")
    name = {"t5": "t5", "umt5": "t5", "mt5": "t5"}.get(model_type, model_type.replace("-", "_"))
    return name if name not in taken else f"{name}_swap"


def swapped_profile(
    base: AlignmentProfile,
    row: SwapFamily,
    encoder: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    out_width: int,
    max_length: int,
    encoder_mask: bool,
    name: str | None,
    source: str,
) -> AlignmentProfile:
    """The profile of the swapped model: the base's, with ``row.slot`` replaced by the projected encoder."""
    old = base.slot(row.slot)
    new_name = _slot_name(encoder, [s for s in base.slot_names if s != row.slot])
    cfg = encoder.config
    tok = TokenizerSpec(
        cls=type(tokenizer).__name__,
        max_length=max_length,
        padding="max_length",
        truncation=True,
        add_special_tokens=True,
        pad_token=tokenizer.pad_token,
        pad_token_id=tokenizer.pad_token_id,
        bos_token=tokenizer.bos_token,
        bos_token_id=tokenizer.bos_token_id,
        eos_token=tokenizer.eos_token,
        eos_token_id=tokenizer.eos_token_id,
    )
    layers = getattr(cfg, "num_layers", None) or getattr(cfg, "num_hidden_layers", None) or 0
    enc = EncoderSpec(
        cls=_projected.CLASS_NAME,
        hidden_size=out_width,
        num_layers=int(layers),
        vocab_size=getattr(cfg, "vocab_size", None),
        layer="last",
        final_layer_norm=True,
        pooled="none",
        dtype=old.encoder.dtype,
    )
    slot = SlotSpec(
        name=new_name,
        tokenizer_subfolder=old.tokenizer_subfolder,
        encoder_subfolder=old.encoder_subfolder,
        tokenizer=tok,
        encoder=enc,
        masks=MaskSpec(encoder=encoder_mask),
        train_dropout=old.train_dropout,
    )
    import re

    ref = re.compile(rf"\b{re.escape(old.name)}\.")
    outputs = tuple((k, ref.sub(f"{new_name}.", v)) for k, v in base.outputs)
    prefix = f"slots.{old.name}"
    kept = tuple((p, v) for p, v in base.provenance if not (p == prefix or p.startswith(prefix + ".")) and not p.startswith("outputs."))
    swap_note = (
        f"te-align swap: slot '{old.name}' of profile '{base.name}' (fingerprint {base.fingerprint()}) replaced by "
        f"{source} ({type(encoder).__name__}, width {_width(cfg)}) and a projection to {out_width}"
    )
    added = (
        (f"slots.{new_name}", Provenance(source="te-align swap", status="code", note=swap_note)),
        (
            f"slots.{new_name}.encoder",
            Provenance(
                source="te-align swap",
                status="code",
                note="the output scale and shift are measured (te_align_swap.json)",
            ),
        ),
        *(
            (
                f"outputs.{k}",
                Provenance(source="te-align swap", status="code", note=f"'{old.name}' renamed '{new_name}'"),
            )
            for k, _ in outputs
        ),
    )
    return replace(
        base,
        name=name or f"{base.name}-{new_name}-swap",
        display_name=f"{base.display_name} with {new_name} (te-align swap)",
        repo="",
        aliases=(),
        slots=tuple(slot if s.name == old.name else s for s in base.slots),
        outputs=outputs,
        description=f"{base.display_name} whose {old.name} slot is a {type(encoder).__name__} plus a projection to "
        f"{out_width} (te-align swap)",
        provenance=kept + added,
    )


# ------------------------------------------------------------------------------------------ reset
def matching_layers(denoiser: torch.nn.Module, patterns: Sequence[str]) -> list[str]:
    """The names of the layers :func:`reset_layers` would re-initialise (nothing is changed)."""
    import re

    return [name for name, _ in denoiser.named_modules() if name and any(re.search(p, "." + name) for p in patterns)]


def check_reset(denoiser: torch.nn.Module, row: SwapFamily, reset: str, *, file: str | None) -> None:
    """Refuse a reset mode that matches no layer of the denoiser (e.g. ``cross`` on a UNet without cross-attention),
    before anything is measured or written."""
    if reset == "none" or matching_layers(denoiser, row.reset[reset]):
        return
    what = {"cross": "cross-attention", "qk": "cross-attention query/key", "all": "attention"}.get(reset, reset)
    raise SwapError(
        f"reset mode '{reset}' re-initialises the {row.denoiser}'s {what} layers, but this "
        f"{type(denoiser).__name__} has none (no layer name matches {' or '.join(row.reset[reset])}); "
        "expected a denoiser with text cross-attention, or --reset none",
        file=file,
        key="--reset",
    )


def reset_layers(denoiser: torch.nn.Module, patterns: Sequence[str]) -> list[str]:
    """Re-initialise the layers whose names match, in ``named_modules()`` order, each by its own
    ``reset_parameters()`` (draws from the global torch RNG); returns their names."""
    import re

    import torch

    done = []
    with torch.no_grad():
        for name, module in denoiser.named_modules():
            if name and any(re.search(p, "." + name) for p in patterns):
                if not hasattr(module, "reset_parameters"):
                    raise SwapError(f"layer '{name}' ({type(module).__name__}) has no reset_parameters()", key="--reset")
                module.reset_parameters()
                done.append(name)
    return done


# ------------------------------------------------------------------------------------------ loading
def _load_base(base: str, config: str, profile: AlignmentProfile) -> DiffusionPipeline:
    return load_pipeline(ModelConfig(path=str(base), config=config, dtype="float32"), profile, dtype_name="float32")


def _load_encoder(source: str) -> PreTrainedModel:
    import transformers

    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise SwapError("expected a transformers text-encoder folder (config.json and weights)", file=str(source), key="--encoder")
    if not any(next(path.glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS):
        raise SwapError(
            "the encoder folder has config.json but no weights (expected model.safetensors, sharded "
            "model-*.safetensors with their index, or pytorch_model.bin)",
            file=str(source),
            key="--encoder",
        )
    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
        arch = (getattr(config, "architectures", None) or [""])[0]
        if getattr(config, "model_type", "") in ("t5", "umt5", "mt5") or arch.startswith(("T5", "UMT5", "MT5")):
            cls_name = {"umt5": "UMT5EncoderModel", "mt5": "MT5EncoderModel"}.get(config.model_type, "T5EncoderModel")
            cls = getattr(transformers, cls_name)
        else:
            cls = getattr(transformers, arch, None) or transformers.AutoModel
        return cls.from_pretrained(str(path), dtype="float32").eval()
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SwapError(f"cannot load the text encoder: {first}", file=str(source), key="--encoder") from None


#: Weight files a transformers folder may hold (any one of them).
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


def _load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(Path(source).expanduser()))
    except (OSError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SwapError(f"cannot load the tokenizer: {first}", file=str(source), key="--tokenizer") from None


def _load_projection(source: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(Path(source).expanduser())))
    except Exception as e:  # a missing, truncated or non-safetensors file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SwapError(
            f"cannot read the projection (expected a .safetensors file with 'weight' and 'bias'): {first}",
            file=str(source),
            key="--projection",
        ) from None


def build_projected(
    encoder: PreTrainedModel, out_width: int, *, encoder_mask: bool, projection: Mapping[str, torch.Tensor] | None
) -> ProjectedTextEncoder:
    """The projected encoder around a copy of ``encoder``'s weights (projection drawn from the global RNG
    unless given; bias zero; scale 1, shift 0)."""
    import torch

    cfg = _projected.ProjectedTextEncoderConfig(
        encoder_class=type(encoder).__name__,
        encoder_config=encoder.config.to_dict(),
        hidden_size=out_width,
        use_attention_mask=encoder_mask,
    )
    state = torch.random.get_rng_state()
    model = _projected.ProjectedTextEncoder(cfg)  # its construction draws random numbers: they do not count
    torch.random.set_rng_state(state)
    model.encoder.load_state_dict(encoder.state_dict())
    with torch.no_grad():
        if projection is None:
            model.projection.reset_parameters()
            model.projection.bias.zero_()
        else:
            model.projection.weight.copy_(projection["weight"])
            model.projection.bias.copy_(projection["bias"] if "bias" in projection else torch.zeros(out_width))
    return model.eval()


# ------------------------------------------------------------------------------------------ writing
def _write_folder(pipe: DiffusionPipeline, profile: AlignmentProfile, report: JSONObject, out: Path) -> None:
    """The new diffusers folder, written into a temporary folder and renamed into place."""
    out = out.expanduser()
    tmp = out.parent / f".{out.name}.swap-{os.getpid()}.tmp"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        fault_point("mkdir", tmp)
        tmp.mkdir()
        fault_point("write", tmp / "model_index.json")
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        fault_point("write", tmp / PROFILE_FILE)
        (tmp / PROFILE_FILE).write_text(profile.to_toml(), encoding="utf-8")
        fault_point("write", tmp / REPORT_FILE)
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        fault_point("rename", out)
        if out.exists():
            raise SwapError("the output folder appeared while the swap was being written; nothing was replaced", file=str(out))
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SwapError(f"cannot write the swapped model: {e.strerror or e}; nothing was written", file=str(out)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------------ swap
def swap(
    base: str | os.PathLike[str] | None,
    encoder: str | os.PathLike[str] | PreTrainedModel,
    out: str | os.PathLike[str] | None,
    *,
    tokenizer: str | os.PathLike[str] | PreTrainedTokenizerBase | None = None,
    captions: Sequence[str] | None = None,
    profile: str | AlignmentProfile = "auto",
    profile_overrides: Mapping[str, Any] | None = None,
    config: str = "",
    reset: str = "cross",
    stats: str = "global",
    shift: bool = False,
    seed: int = 0,
    max_length: int | None = None,
    encoder_mask: bool = False,
    projection: str | Mapping[str, torch.Tensor] | None = None,
    name: str | None = None,
    pipeline: DiffusionPipeline | None = None,
) -> tuple[SwapReport, DiffusionPipeline]:
    """Swap the text encoder of ``base`` for ``encoder`` (+ ``tokenizer``); returns (report, swapped pipeline).

    ``base``: a diffusers folder, hub id or single-file checkpoint (``config``: its diffusers configs),
    or None with ``pipeline`` (an already loaded pipeline) and ``profile``. ``encoder`` / ``tokenizer``: a
    transformers folder or loaded objects (the tokenizer defaults to the encoder's folder). ``out``: the
    new folder (None: nothing is written, e.g. to train in memory; a given ``pipeline`` is swapped in place
    and a given tokenizer object gets ``model_max_length`` set to the slot's length). ``projection``: a .safetensors file
    (or a mapping) with ``weight`` (out, in) and an optional ``bias`` to start from. See the module
    docstring for the steps and the random draws.
    """
    import torch


    check_request(reset, stats, out)
    if base is None and (pipeline is None or profile == "auto"):
        raise SwapError("give a base model, or an already loaded pipeline with its profile", key="--base")
    base_profile = resolve(profile if profile != "auto" else str(base), ("--override", profile_overrides or None))
    row = family_row(base_profile)
    configs = config or base  # a single-file base's configs are in ``config``
    where: dict[str, str] = {"denoiser": f"{configs}/{row.denoiser}/config.json" if configs is not None else row.denoiser}
    if isinstance(encoder, (str, os.PathLike)):
        where["encoder"] = f"{encoder}/config.json"
        where["tokenizer"] = str(tokenizer if isinstance(tokenizer, (str, os.PathLike)) else encoder)
        enc_source = str(encoder)
        if tokenizer is None:
            tokenizer = encoder
        encoder = _load_encoder(str(encoder))
    else:
        enc_source = type(encoder).__name__
        where.setdefault("encoder", "the new text encoder's config")
        where["tokenizer"] = str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else "the tokenizer"
    if tokenizer is None:
        raise SwapError("give the new encoder's tokenizer", key="--tokenizer")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = _load_tokenizer(str(tokenizer))
    proj_weights = None
    if projection is not None:
        proj_weights = _load_projection(str(projection)) if isinstance(projection, (str, os.PathLike)) else dict(projection)
    pipe = pipeline if pipeline is not None else _load_base(str(base), config, base_profile)
    denoiser = getattr(pipe, row.denoiser)
    in_width, out_width = check_parts(base_profile, row, denoiser, encoder, tokenizer, where=where)
    check_reset(denoiser, row, reset, file=where.get("denoiser"))
    if proj_weights is not None:
        check_projection(
            proj_weights,
            in_width,
            out_width,
            file=str(projection) if isinstance(projection, (str, os.PathLike)) else "projection",
        )
    old = base_profile.slot(row.slot)
    length = max_length or old.tokenizer.max_length
    if length < 1:
        raise SwapError(f"must be >= 1, got {length}", key="--max-length")
    positions = getattr(encoder.config, "max_position_embeddings", None)
    if isinstance(positions, int) and length > positions:
        raise SwapError(
            f"the new slot pads prompts to {length} tokens but the encoder has {positions} positions "
            f"(max_position_embeddings); expected --max-length <= {positions}",
            file=where.get("encoder"),
            key="max_position_embeddings",
        )
    texts = list(captions) if captions else list(DEFAULT_CAPTIONS)

    # 4. the target: what the denoiser was trained on
    target = _measure_with(base_profile, texts, stats, row, pipe)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        projected = build_projected(encoder, out_width, encoder_mask=encoder_mask, projection=proj_weights)
        new_profile = swapped_profile(
            base_profile,
            row,
            encoder,
            tokenizer,
            out_width=out_width,
            max_length=length,
            encoder_mask=encoder_mask,
            name=name,
            source=enc_source,
        )
        tokenizer.model_max_length = length  # diffusers' SD pipelines pad to it
        pipe.register_modules(**{old.tokenizer_subfolder: tokenizer, old.encoder_subfolder: projected})
        before = _measure_with(new_profile, texts, stats, row, pipe)
        scale = target.std / before.std.clamp_min(1e-30)
        offset = (target.mean - before.mean * scale) if shift else torch.zeros_like(scale)
        with torch.no_grad():
            projected.output_scale.copy_(scale.expand(out_width).to(projected.output_scale.dtype))
            projected.output_shift.copy_(offset.expand(out_width).to(projected.output_shift.dtype))
        after = _measure_with(new_profile, texts, stats, row, pipe)
        layers = reset_layers(denoiser, row.reset[reset])
        if reset != "none" and not layers:
            raise SwapError(
                f"reset mode '{reset}' matches no layer of the {row.denoiser} ({type(denoiser).__name__})", key="--reset"
            )
    new_profile = _with_measured_provenance(new_profile, base_profile, target, before, scale, offset, row)
    report = SwapReport(
        out=Path(out) if out is not None else None,
        profile=new_profile,
        target=target,
        before=before,
        after=after,
        scale=[float(x) for x in scale],
        shift=[float(x) for x in offset],
        reset=reset,
        reset_layers=layers,
        seed=seed,
    )
    if out is not None:
        record = dict(
            report.as_dict(),
            base=str(base),
            base_profile=base_profile.name,
            base_fingerprint=base_profile.fingerprint(),
            encoder=enc_source,
            captions=len(texts),
        )
        _write_folder(pipe, new_profile, record, Path(out))
    return report, pipe


def _with_measured_provenance(profile: AlignmentProfile, base: AlignmentProfile, target: Stats, before: Stats,
                              scale: torch.Tensor, offset: torch.Tensor, row: SwapFamily) -> AlignmentProfile:
    """The swapped profile with the measured scale and shift in its provenance (not behaviour: they live in the
    encoder's weights, which every embedding-cache key hashes)."""
    t, b = target.summary(), before.summary()
    values = _compact([float(x) for x in scale]), _compact([float(x) for x in offset])
    shown = [f"{v:.6g}" if isinstance(v, float) else f"{len(v)} per-channel values (te_align_swap.json)" for v in values]
    note = (f"output scale {shown[0]}, shift {shown[1]}: measured {target.mode} statistics of '{row.output}' over "
            f"{target.positions} attended positions of {target.captions} captions: base '{base.name}' mean {t['mean']:.6g} "
            f"std {t['std']:.6g}; new encoder through the initial projection mean {b['mean']:.6g} std {b['std']:.6g}")
    slot = next(s.name for s in profile.slots if s.encoder.cls == "ProjectedTextEncoder")
    path = f"slots.{slot}.encoder"
    prov = tuple(
        (p, Provenance(source="te-align swap (measured)", status="code", note=note) if p == path else v)
        for p, v in profile.provenance
    )
    return replace(profile, provenance=prov)


def _measure_with(profile: AlignmentProfile, texts: list[str], stats: str, row: SwapFamily, pipe: DiffusionPipeline) -> Stats:
    return measure(profile, texts, mode=stats, output=row.output, pipeline=pipe)


__all__ = [
    "DEFAULT_CAPTIONS",
    "PROFILE_FILE",
    "REPORT_FILE",
    "SwapError",
    "SwapReport",
    "build_projected",
    "check_parts",
    "check_projection",
    "check_request",
    "check_reset",
    "family_row",
    "matching_layers",
    "reset_layers",
    "swap",
    "swapped_profile",
]
