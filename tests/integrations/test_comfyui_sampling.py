"""A full ComfyUI sampling run through the te-align node, headless (no server), with ComfyUI's real code from a
checkout (TE_ALIGN_COMFYUI_DIR).

ComfyUI's own loaders read a tiny Flux model (UNETLoader: a diffusers-format file ComfyUI converts and detects),
a tiny TAEF1-layout VAE (VAELoader) and a LoRA stamped with the profile it was trained with (LoraLoaderModelOnly)
from its model folders; "te-align Text Encode" and "te-align Empty Negative" encode by that profile ("from LoRA");
KSampler samples, VAEDecode decodes and SaveImage writes the PNG. The nodes are called from Python as ComfyUI's
executor calls them (under ``torch.inference_mode``); a model wrapper (ComfyUI's public
``set_model_unet_function_wrapper``) records what the diffusion model receives at every step."""

from __future__ import annotations

import os

import pytest

from tests.support.comfyui import comfyui_or_skip

DIR = comfyui_or_skip()  # one skip reason for the module when ComfyUI or one of its requirements is missing

import folder_paths  # noqa: E402  (ComfyUI's, from the checkout)
import nodes  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402

from te_align.integrations.comfyui import tiny  # noqa: E402
from te_align.integrations.comfyui.nodes import TeAlignEmptyNegative, TeAlignTextEncode  # noqa: E402
from te_align.metadata import stamp_keys  # noqa: E402

PROMPT = "a photo of a red cube on a wooden table"
LORA = "tiny-flux-lora.safetensors"
SIZE = 64


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tc = tiny.build("flux", DIR)
    root = tmp_path_factory.mktemp("comfyui-models")
    names = tiny.flux_model_files(root, tc)
    # a LoRA on the first double block's image attention, stamped with the (tiny-fitted) flux-dev profile
    (root / "loras").mkdir()
    g = torch.Generator().manual_seed(27)
    lora = {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.randn(4, 128, generator=g) * 0.1,
            "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.randn(384, 4, generator=g) * 0.1,
            "lora_unet_double_blocks_0_img_attn_qkv.alpha": torch.tensor(4.0)}
    profile = tiny.fitted_profile("flux-dev", tc)
    safetensors.torch.save_file(lora, str(root / "loras" / LORA), metadata=stamp_keys(profile))
    saved = {k: (list(folder_paths.folder_names_and_paths[k][0]), folder_paths.folder_names_and_paths[k][1])
             for k in ("diffusion_models", "vae", "loras")}
    old_output = folder_paths.get_output_directory()
    for sub in ("diffusion_models", "vae", "loras"):
        folder_paths.add_model_folder_path(sub, str(root / sub), is_default=True)
    output = tmp_path_factory.mktemp("comfyui-output")
    folder_paths.set_output_directory(str(output))
    yield {"tiny": tc, "names": names, "profile": profile, "output": output}
    folder_paths.set_output_directory(old_output)
    folder_paths.folder_names_and_paths.update(saved)


def _sample(world, positive, negative, seed=0):
    """UNETLoader -> LoraLoaderModelOnly -> KSampler -> VAEDecode; (image, what the model received per step)."""
    seen: list[dict] = []

    def wrapper(apply_model, args):
        seen.append({k: v for k, v in args["c"].items() if k != "transformer_options"})
        return apply_model(args["input"], args["timestep"], **args["c"])

    with torch.inference_mode():
        model = nodes.UNETLoader().load_unet(world["names"]["diffusion_models"], "default")[0]
        model = nodes.LoraLoaderModelOnly().load_lora_model_only(model, LORA, 1.0)[0]
        assert "diffusion_model.double_blocks.0.img_attn.qkv.weight" in model.patches  # the LoRA is applied
        model.set_model_unet_function_wrapper(wrapper)
        vae = nodes.VAELoader().load_vae(world["names"]["vae"])[0]
        latent = nodes.EmptyLatentImage().generate(SIZE, SIZE, 1)[0]
        samples = nodes.KSampler().sample(model, seed, 3, 1.0, "euler", "simple", positive, negative, latent)[0]
        image = nodes.VAEDecode().decode(vae, samples)[0]
    return image, seen


def test_sampling_through_the_node_writes_an_image(world):
    tc = world["tiny"]
    with torch.inference_mode():
        pos = TeAlignTextEncode().encode(tc.clip, "from LoRA", PROMPT, lora_name=LORA, guidance=3.5)
        neg = TeAlignEmptyNegative().encode(tc.clip, "from LoRA", lora_name=LORA)
    positive, info = pos["result"]
    negative = neg["result"][0]
    assert info.startswith(f"{LORA}: profile flux-dev with ") and "(te_align.* metadata)" in info
    assert f"fingerprint {world['profile'].fingerprint()}" in info

    image, seen = _sample(world, positive, negative)
    # the diffusion model received the node's conditioning at every step: T5 at 512 (flux-dev), CLIP-L pooled,
    # guidance 3.5 (cfg 1: ComfyUI runs only the positive, as for Flux-dev)
    assert len(seen) == 3
    for c in seen:
        assert torch.equal(c["c_crossattn"], positive[0][0]) and c["c_crossattn"].shape == (1, 512, 128)
        assert torch.equal(c["y"], positive[0][1]["pooled_output"])
        assert c["guidance"].tolist() == [3.5]

    assert image.shape == (1, SIZE, SIZE, 3) and image.dtype == torch.float32
    assert torch.isfinite(image).all() and 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert float(image.std()) > 0.0
    saved = nodes.SaveImage().save_images(image, "te-align-tiny")["ui"]["images"]
    path = os.path.join(folder_paths.get_output_directory(), saved[0]["subfolder"], saved[0]["filename"])
    from PIL import Image

    with Image.open(path) as png:
        assert png.format == "PNG" and png.size == (SIZE, SIZE)

    again, _ = _sample(world, positive, negative)
    assert torch.equal(again, image)  # same seed, same conditioning: the same image
    with torch.inference_mode():
        stock = nodes.CLIPTextEncode().encode(tc.clip, PROMPT)[0]
    stock_image, stock_seen = _sample(world, stock, negative)
    assert stock_seen[0]["c_crossattn"].shape == (1, 256, 128)  # ComfyUI's own node: T5 padded to 256
    assert not torch.equal(stock_image, image)  # the conditioning the LoRA was trained with changes the image


class _TinyCLIP:
    """Test fixture node: hands the tiny ComfyUI CLIP object to the graph (real CLIP files are too large here)."""

    CLIP = None
    RETURN_TYPES = ("CLIP",)
    FUNCTION = "load"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def load(self):
        return (self.CLIP,)


class _Server:
    """Where ComfyUI's executor sends its messages (the web server's role): recorded here."""

    def __init__(self):
        self.client_id, self.last_node_id, self.sockets_metadata, self.messages = "te-align-test", None, {}, []

    def send_sync(self, event, data, sid=None):
        self.messages.append((event, data))


def _graph(lora_name, prompt=PROMPT, seed=0):
    return {
        "1": {"class_type": "TeAlignTestTinyCLIP", "inputs": {}},
        "2": {"class_type": "UNETLoader", "inputs": {"unet_name": "tiny-flux.safetensors", "weight_dtype": "default"}},
        "3": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["2", 0], "lora_name": LORA, "strength_model": 1.0}},
        "4": {"class_type": "VAELoader", "inputs": {"vae_name": "tiny-taef1.safetensors"}},
        "5": {"class_type": "TeAlignTextEncode", "inputs": {"clip": ["1", 0], "profile": "from LoRA", "text": prompt,
                                                            "lora_name": lora_name, "guidance": 3.5, "width": 0, "height": 0}},
        "6": {"class_type": "TeAlignEmptyNegative", "inputs": {"clip": ["1", 0], "profile": "from LoRA", "lora_name": lora_name,
                                                               "guidance": 3.5, "width": 0, "height": 0}},
        "7": {"class_type": "EmptyLatentImage", "inputs": {"width": SIZE, "height": SIZE, "batch_size": 1}},
        "8": {"class_type": "KSampler", "inputs": {"model": ["3", 0], "seed": seed, "steps": 3, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple", "positive": ["5", 0],
                                                   "negative": ["6", 0], "latent_image": ["7", 0], "denoise": 1.0}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["8", 0], "vae": ["4", 0]}},
        "10": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "te-align-graph"}},
    }


def test_workflow_through_comfyuis_executor(world, tmp_path):
    """The installed node package loaded as ComfyUI loads custom nodes, a workflow validated and run by ComfyUI's
    own executor (as its server does for a queued prompt); a user mistake stops it with one line, no traceback."""
    import asyncio

    import execution

    from te_align.integrations.comfyui.install import LOADER_SOURCE

    package = tmp_path / "custom_nodes" / "te-align"
    package.mkdir(parents=True)
    (package / "__init__.py").write_bytes(LOADER_SOURCE)  # what `te-align comfyui install` writes
    added = {"TeAlignTestTinyCLIP"}
    before = set(nodes.NODE_CLASS_MAPPINGS)
    try:
        assert asyncio.run(nodes.load_custom_node(str(package)))
        added |= set(nodes.NODE_CLASS_MAPPINGS) - before
        assert {"TeAlignTextEncode", "TeAlignEmptyNegative"} <= added
        _TinyCLIP.CLIP = world["tiny"].clip
        nodes.NODE_CLASS_MAPPINGS["TeAlignTestTinyCLIP"] = _TinyCLIP

        server = _Server()
        executor = execution.PromptExecutor(server, cache_type=execution.CacheType.CLASSIC,  # ComfyUI's default
                                            cache_args={"lru": 0, "ram": 0})

        def run(graph, prompt_id):
            valid = asyncio.run(execution.validate_prompt(prompt_id, graph, None))
            assert valid[0], valid[1:]
            server.messages.clear()
            executor.execute(graph, prompt_id, {"client_id": server.client_id}, valid[2])
            return executor, server

        executor, server = run(_graph(LORA), "te-align-ok")
        assert executor.success and not [m for m in server.messages if m[0] == "execution_error"]
        text = executor.history_result["outputs"]["5"]["text"][0]
        assert text.startswith(f"{LORA}: profile flux-dev with ") and ", 512, 128)" in text
        saved = executor.history_result["outputs"]["10"]["images"]
        from PIL import Image

        with Image.open(os.path.join(folder_paths.get_output_directory(), saved[0]["subfolder"], saved[0]["filename"])) as png:
            assert png.size == (SIZE, SIZE)

        for attempt in ("te-align-bad", "te-align-bad-again"):  # 'from LoRA' without a LoRA: a user mistake
            executor, server = run(_graph("(none)"), attempt)  # queued again: reported again, not replayed silently
            errors = [m[1] for m in server.messages if m[0] == "execution_error"]
            assert len(errors) == 1 and errors[0]["traceback"] == [] and errors[0]["exception_type"] == "ExecutionBlocked"
            assert errors[0]["exception_message"] == ("Execution Blocked: te-align Text Encode: profile is 'from LoRA' "
                                                      "but no LoRA is chosen: pick the LoRA you sample with, or a profile")
            assert "10" not in executor.history_result["outputs"]  # nothing was sampled or saved
        executor, server = run(_graph(LORA), "te-align-ok-again")  # fixed: runs (the model nodes come from the cache)
        assert executor.success and not [m for m in server.messages if m[0] == "execution_error"]
        assert "10" in executor.history_result["outputs"]
    finally:
        for name in added:
            nodes.NODE_CLASS_MAPPINGS.pop(name, None)
            nodes.NODE_DISPLAY_NAME_MAPPINGS.pop(name, None)
