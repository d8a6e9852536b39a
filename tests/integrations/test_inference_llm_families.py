"""te-align check --for comfyui|forge on the LLM-encoder families (issue 45): the notes printed for an ai-toolkit job
of each family, read from ComfyUI fe25114 (Krea 2 and Ideogram 4 from the later commits they were added at)."""

from __future__ import annotations

from pathlib import Path

import pytest

import te_align
from te_align.cli import main
from te_align.integrations.targets import inference_notes

JOB = ("job: extension\nconfig:\n  name: x\n  process:\n    - type: sd_trainer\n      model:\n        arch: {arch}\n"
       "        name_or_path: {path}\n      train:\n        batch_size: 1\n")
UNKNOWN = "= unknown (the trainer does not record it); the profile says "


def comfy_out(tmp_path: Path, capsys, arch: str, path: str) -> str:
    cfg = tmp_path / f"{arch}.yaml"
    cfg.write_text(JOB.format(arch=arch, path=path), encoding="utf-8")
    main(["check", str(cfg), "--for", "comfyui"])
    out = capsys.readouterr().out
    return " ".join(out[out.index("sampling in ComfyUI:"):].split())


def test_flux2_dev_is_not_padded_and_keeps_img(tmp_path, capsys):
    out = comfy_out(tmp_path, capsys, "flux2", "black-forest-labs/FLUX.2-dev")
    assert ("note you trained at 512 (mistral.tokenizer.max_length); ComfyUI does not pad the Mistral prompt "
            "(min_length=1, and pad_left=True where it pads) and never truncates (max_length=99999999), so the "
            "transformer, which gets no mask, sees the prompt's tokens only, not 512, unless you sample in diffusers, "
            "where Flux2Pipeline's default call encodes as the profile (the te-align node does not encode FLUX.2) "
            "source: comfyanonymous/ComfyUI@fe25114 comfy/text_encoders/flux.py:118-121 (Mistral3Tokenizer), 126-138 "
            "(Flux2Tokenizer); comfy/model_base.py:889-898 (Flux2 inherits Flux: no mask to the model)") in out
    assert (f"note you trained with mistral.tokenizer.text_cleaning {UNKNOWN}drop_img_tokens, and ComfyUI does not "
            "remove \"[IMG]\" from the prompt (Flux2Tokenizer formats the text into its system-prompt template as "
            "written), unless you remove \"[IMG]\" from prompts before sampling; prompts without it are unaffected "
            "source: comfyanonymous/ComfyUI@fe25114 comfy/text_encoders/flux.py:126-138") in out
    assert "prompt syntax" not in out  # Flux2Tokenizer passes disable_weights=True


@pytest.mark.parametrize(("arch", "path"), [("flux2_klein_4b", "black-forest-labs/FLUX.2-klein-4B"),
                                            ("flux2_klein_9b", "black-forest-labs/FLUX.2-klein-9B")])
def test_klein_pads_to_512_but_never_cuts(tmp_path, capsys, arch, path):
    out = comfy_out(tmp_path, capsys, arch, path)
    assert (f"note you trained with qwen3.tokenizer.truncation {UNKNOWN}true, and ComfyUI pads Qwen3 to at least 512 "
            "tokens but never cuts a longer prompt (Qwen3Tokenizer min_length=512, max_length=99999999), unless you "
            "keep prompts, with the chat template, under 512 Qwen3 tokens, or sample in diffusers, where "
            "Flux2KleinPipeline's default call encodes as the profile (the te-align node does not encode FLUX.2 klein) "
            "source: comfyanonymous/ComfyUI@fe25114 comfy/text_encoders/flux.py:176-203 (template with the empty think "
            "block at :194)") in out
    assert out.count("note ") == 1


def test_z_image_never_cuts(tmp_path, capsys):
    out = comfy_out(tmp_path, capsys, "zimage", "Tongyi-MAI/Z-Image-Turbo")
    assert (f"note you trained with qwen3.tokenizer.truncation {UNKNOWN}true, and ComfyUI never cuts a prompt over 512 "
            "tokens (Qwen3Tokenizer min_length=1, max_length=99999999: no padding, no truncation), unless you keep "
            "prompts, with the chat template, under 512 Qwen3 tokens, or sample in diffusers, where ZImagePipeline's "
            "default call encodes as the profile (the te-align node does not encode Z-Image) source: "
            "comfyanonymous/ComfyUI@fe25114 comfy/text_encoders/z_image.py:6-9 (Qwen3Tokenizer), 15-23 (template, "
            "weights off)") in out
    assert out.count("note ") == 1


def test_qwen_image_edit_versions_name_their_node(tmp_path, capsys):
    out = comfy_out(tmp_path, capsys, "qwen_image_edit", "Qwen/Qwen-Image-Edit")
    assert ("note you trained with qwen.images.resample = bilinear, not the profile's lanczos; ComfyUI gives the VL "
            "encoder the image scaled to about 1024x1024 pixels by \"area\" resampling with no rounding to a multiple "
            "of 32 in TextEncodeQwenImageEdit (CLIPTextEncode uses Qwen-Image's text-to-image template and no image), "
            "unless you encode with the TextEncodeQwenImageEdit node (its template and 64-token drop are the "
            "profile's); the VL image's resampling has no setting source: comfyanonymous/ComfyUI@fe25114 "
            "comfy_extras/nodes_qwen.py:28-50, comfy/text_encoders/qwen_image.py:17-38 (templates), 61-85 (drops the "
            "prefix up to <|im_start|>user\\n)") in out
    assert out.count("note ") == 1
    plus = comfy_out(tmp_path, capsys, "qwen_image_edit_plus", "Qwen/Qwen-Image-Edit-2509")
    assert ("note you trained with qwen.images.resample = bilinear, not the profile's lanczos; ComfyUI gives the VL "
            "encoder each image scaled to about 384x384 pixels by \"area\" resampling with no rounding to a multiple "
            "of 32 in TextEncodeQwenImageEditPlus (TextEncodeQwenImageEdit uses the original Edit template and "
            "1024x1024; CLIPTextEncode Qwen-Image's text-to-image template), unless you encode with the "
            "TextEncodeQwenImageEditPlus node (its \"Picture N:\" prefix and template are the profile's); the VL "
            "image's resampling has no setting source: comfyanonymous/ComfyUI@fe25114 comfy_extras/nodes_qwen.py:"
            "73-106, comfy/text_encoders/qwen_image.py:61-85") in plus
    assert plus.count("note ") == 1
    for name in ("qwen-image-edit-2509", "qwen-image-edit-2511"):
        assert [n.tool_value for n in inference_notes(te_align.profile(name), "comfyui")] == ["area"]


def test_krea2_and_ideogram4_cite_the_commit_that_has_them(tmp_path, capsys):
    out = comfy_out(tmp_path, capsys, "krea2", "krea/krea-2")
    assert (f"note you trained with qwen.tokenizer.truncation {UNKNOWN}true, and ComfyUI does not pad the prompt "
            "(min_length=1, so the model gets no padding before the template's suffix) and never cuts a prompt over "
            "512 tokens (max_length=99999999), unless you keep prompts, with the chat template, under 512 Qwen3-VL "
            "tokens, or sample in diffusers, where Krea2Pipeline's default call encodes as the profile (the te-align "
            "node does not encode Krea 2) source: comfyanonymous/ComfyUI@1e32fc1 comfy/text_encoders/krea2.py:17-33 "
            "(taps, template, no think block), 46-75 (drops the prefix up to <|im_start|>user\\n); "
            "comfyanonymous/ComfyUI@d763a4d comfy/text_encoders/qwen3vl.py (Qwen3VLSDTokenizer: min_length=1, "
            "max_length=99999999, weights off). Not in ComfyUI fe25114") in out
    out = comfy_out(tmp_path, capsys, "ideogram4", "ideogram-ai/ideogram-v4")
    # ai-toolkit cuts Ideogram captions at model_kwargs.max_text_length, 3072 by default: the trained value is known
    assert ("note you trained at 3072 (qwen.tokenizer.max_length), not the profile's 2048; ComfyUI does not pad Qwen3-VL "
            "(min_length=1; the profile left-pads to 2048 and zeroes the padding) and encodes a prompt over 2048 tokens "
            "instead of refusing it, unless you sample in diffusers with max_sequence_length=3072 (no ComfyUI setting "
            "pads it) source: comfyanonymous/ComfyUI@0f548d2 "
            "comfy/text_encoders/ideogram4.py:19-42 (tokenizer, template, weights off), 15-16 and 64-68 (the 13 taps, "
            "offset +1, interleaved as the profile). Not in ComfyUI fe25114") in out


def test_ltx2_unpadded_unstripped_and_weighted(tmp_path, capsys):
    out = comfy_out(tmp_path, capsys, "ltx2", "Lightricks/LTX-2")
    # ai-toolkit's LTX-2 rules know its length (1024, padded by pad_embeds) and its stripping
    assert ("note you trained at 1024 (gemma.tokenizer.max_length); ComfyUI does not pad Gemma "
            "(min_length=1) and never truncates (max_length=99999999): the text connectors get the prompt's tokens "
            "only, not 1024 left-padded ones, unless you sample in diffusers, where LTX2Pipeline's default call "
            "encodes as the profile (the te-align node does not encode LTX-2) source: comfyanonymous/ComfyUI@fe25114 "
            "comfy/text_encoders/lt.py:25-35 (Gemma3_12BTokenizer), 96-112 (all layers, normalised over the unpadded "
            "tokens)") in out
    assert ("note you trained with gemma.tokenizer.text_cleaning = strip; ComfyUI does not strip spaces "
            "and line breaks from the ends of the prompt, unless you write prompts without leading or trailing "
            "whitespace") in out
    assert ("note ComfyUI reads (word:1.2) and (word) in a prompt as Gemma token weights (Gemma3_12BTokenizer keeps "
            "weights on) write prompts without ( ) or escape them as \\( \\) source: comfyanonymous/ComfyUI@fe25114 "
            "comfy/text_encoders/lt.py:25-28;") in out


def test_a_trained_value_equal_to_comfyuis_gives_no_note():
    """Klein trained without truncation (every prompt under 512) meets ComfyUI's encoding: no note."""
    prof = te_align.profile("flux2-klein-4b")
    assert inference_notes(prof, "comfyui", {"qwen3.tokenizer.truncation": False}) == []


@pytest.mark.parametrize("name", ["flux2-dev", "flux2-klein-4b", "z-image", "qwen-image-edit-2511", "krea2",
                                  "ideogram4", "ltx2"])
def test_forge_has_no_engine_for_the_new_families(name):
    """Forge at dfdcbab has engines for SD1.5, SD2, SDXL, SD3.5, Flux and Chroma only: no Forge notes are invented."""
    assert inference_notes(te_align.profile(name), "forge") == []
