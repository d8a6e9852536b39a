"""The text encoder of a swapped model (``te-align swap``): a transformers encoder, then a linear
projection to the width the denoiser takes, with a fixed output scale and shift.

    prompt_embeds = projection(encoder(ids).last_hidden_state) * output_scale + output_shift

``output_scale`` and ``output_shift`` are buffers of the projection's output width (a global scale is
one value repeated), measured by ``te-align swap`` so that the conditioning has the statistics the
denoiser was trained on; the projection is the trainable part. It is a transformers
``PreTrainedModel`` (``save_pretrained`` / ``from_pretrained``), so a swapped diffusers folder loads
with diffusers' own pipeline classes once this module is imported, and its ``config.hidden_size`` is
the output width (what profiles and ``check_components`` compare). ``config.use_attention_mask``
says whether the mask goes into the inner encoder, as diffusers' SD pipelines read it.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import (  # PreTrainedModel: diffusers' loader looks it up here
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutput

MODEL_TYPE = "te_align_projected"
#: The class name profiles give as ``encoder.cls`` (te_align.encoding.loading resolves it here).
CLASS_NAME = "ProjectedTextEncoder"


class ProjectedTextEncoderConfig(PretrainedConfig):
    """``encoder_class``: the transformers class of the inner encoder (``T5EncoderModel``);
    ``encoder_config``: its config as a dict; ``hidden_size``: the output (projection) width."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        encoder_class: str = "T5EncoderModel",
        encoder_config: dict[str, Any] | None = None,
        hidden_size: int = 768,
        use_attention_mask: bool = False,
        projection_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        self.encoder_class = encoder_class
        self.encoder_config = dict(encoder_config or {})
        self.hidden_size = hidden_size
        self.use_attention_mask = use_attention_mask
        self.projection_bias = projection_bias
        super().__init__(**kwargs)

    def inner_config(self) -> Any:
        data = dict(self.encoder_config)
        model_type = data.pop("model_type", None)
        if not model_type:
            raise ValueError("encoder_config has no model_type")
        return transformers.AutoConfig.for_model(model_type, **data)

    @property
    def input_width(self) -> int:
        inner = self.inner_config()
        for name in ("d_model", "hidden_size"):
            value = getattr(inner, name, None)
            if isinstance(value, int):
                return value
        raise ValueError(f"encoder_config ({self.encoder_class}) states no width (d_model / hidden_size)")


def inner_encoder_class(name: str) -> Any:
    cls = getattr(transformers, name, None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, PreTrainedModel):
        raise ValueError(f"encoder_class {name!r} is not a transformers model class")
    return cls


class ProjectedTextEncoder(PreTrainedModel):
    """An inner text encoder followed by ``projection`` and the fixed ``output_scale`` / ``output_shift``."""

    config_class = ProjectedTextEncoderConfig
    base_model_prefix = "te_align_projected"
    main_input_name = "input_ids"

    def __init__(self, config: ProjectedTextEncoderConfig) -> None:
        super().__init__(config)
        self.encoder = inner_encoder_class(config.encoder_class)(config.inner_config())
        width = config.input_width
        self.projection = torch.nn.Linear(width, config.hidden_size, bias=config.projection_bias)
        self.register_buffer("output_scale", torch.ones(config.hidden_size))
        self.register_buffer("output_shift", torch.zeros(config.hidden_size))
        self.post_init()

    def _init_weights(self, module: Any) -> None:
        if module is self.projection:
            module.reset_parameters()
        elif module is not self and any(module is m for m in self.encoder.modules()):
            self.encoder._init_weights(module)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The conditioning of inner hidden states: ``projection(hidden) * output_scale + output_shift``."""
        out = self.projection(hidden.to(self.projection.weight.dtype))
        return out * self.output_scale.to(out.dtype) + self.output_shift.to(out.dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        inner = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=output_hidden_states)
        last = self.project(inner.last_hidden_state)
        hidden_states = None
        if output_hidden_states:
            # the inner layers, then the projected output: hidden_states[-1] is what the denoiser gets
            hidden_states = (*inner.hidden_states, last)
        out = BaseModelOutput(last_hidden_state=last, hidden_states=hidden_states)
        return out if return_dict is not False else out.to_tuple()


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModel`` know the class (idempotent)."""
    from transformers import AutoConfig, AutoModel

    try:
        AutoConfig.register(MODEL_TYPE, ProjectedTextEncoderConfig)
    except ValueError:
        pass  # already registered: this module was imported before
    try:
        AutoModel.register(ProjectedTextEncoderConfig, ProjectedTextEncoder)
    except ValueError:
        pass


register()

__all__ = ["CLASS_NAME", "MODEL_TYPE", "ProjectedTextEncoder", "ProjectedTextEncoderConfig", "register"]
