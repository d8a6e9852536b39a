"""Model files for looking at te-align's ComfyUI nodes in a browser (tools/comfyui_server.sh, the README screenshot).

Writes into a ComfyUI ``models`` folder:

* ``text_encoders/clip_l-random.safetensors`` -- a CLIP-L text encoder at its real size (12 layers x 768, the
  openai/clip-vit-large-patch14 text shape) with random weights (transformers' init, seed 0, float16), in the key
  layout ComfyUI's CLIPLoader reads (``text_model.*``, ``text_projection.weight``). Real weights are not needed to
  show what the nodes do: the conditioning's shape and the profile line do not depend on them.
* ``loras/lora-without-metadata.safetensors`` -- a LoRA file with one small tensor and no metadata, so the
  "from LoRA" input shows the fallback line a user sees for a LoRA that names no profile.

    python tools/comfyui_demo_models.py /path/to/ComfyUI/models
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/comfyui_demo_models.py <ComfyUI models folder>")
        return 2
    import safetensors.torch
    import torch
    import transformers

    models = Path(argv[0])
    (models / "text_encoders").mkdir(parents=True, exist_ok=True)
    (models / "loras").mkdir(parents=True, exist_ok=True)
    clip_out = models / "text_encoders" / "clip_l-random.safetensors"
    if not clip_out.exists():
        config = transformers.CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                             num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                                             hidden_act="quick_gelu", projection_dim=768, bos_token_id=49406,
                                             eos_token_id=49407, pad_token_id=1)
        torch.manual_seed(0)
        model = transformers.CLIPTextModelWithProjection(config).eval()
        state = {}
        for k, v in model.state_dict().items():
            if not k.startswith(("text_model.", "text_projection.")):
                k = f"text_model.{k}"  # newer transformers flatten CLIPTextModel's keys; ComfyUI reads text_model.*
            state[k] = v.detach().to(torch.float16).contiguous()
        safetensors.torch.save_file(state, str(clip_out))
    lora_out = models / "loras" / "lora-without-metadata.safetensors"
    if not lora_out.exists():
        safetensors.torch.save_file({"lora_te_text_model_encoder_layers_0_mlp_fc1.alpha": torch.tensor(1.0)}, str(lora_out))
    print(f"wrote {clip_out} and {lora_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
