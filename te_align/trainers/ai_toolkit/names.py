"""ostris/ai-toolkit: ``model:`` section (``arch`` or ``is_*`` flags, ``name_or_path``) -> profile.

ai-toolkit names its model architectures in ``model.arch`` (``toolkit/config_modules.py``, read at
ostris/ai-toolkit@27a03a91f23eb1b757d5ec2e80ee3e129cfcc350; ``arch: "wan22_14b:t2v"`` carries a mode
after the colon); older configs set ``is_*`` flags instead, and a config with neither trains SD 1.x.
"""

from __future__ import annotations

from collections.abc import Mapping

#: ``model.arch`` -> (bundled profile, whether te-align's ai-toolkit hooks encode that arch by it).
#: Not hooked: SSD-1B and Vega and Flex.2 (not verified), PixArt-α (no bundled profile; ``te-align check``
#: reads it as PixArt-Σ). FLUX.1 and SD3 pick their variant from ``name_or_path`` (:func:`hooked_profile`).
ARCHS: dict[str, tuple[str, bool]] = {
    "sd1": ("sd15", True), "sd2": ("sd21", True), "sdxl": ("sdxl", True), "ssd": ("sdxl", False),
    "vega": ("sdxl", False), "sd3": ("sd35-large", True), "flux": ("flux-dev", True), "flex1": ("flux-dev", True),
    "flex2": ("flux-dev", False), "chroma": ("chroma", True), "lumina2": ("lumina2", True),
    "hidream": ("hidream", True), "qwen_image": ("qwen-image", True), "wan21": ("wan21", True),
    "wan22_14b": ("wan21", True), "wan22_5b": ("wan21", True), "pixart": ("pixart-sigma", False),
    "pixart_sigma": ("pixart-sigma", True), "auraflow": ("auraflow", True),
}  # fmt: skip
#: ``model.arch`` -> profile, for archs `te-align check` reads but te-align's hooks do not encode (their model classes
#: have their own get_prompt_embeds; the hooks refuse them): FLUX.2 dev and klein, Z-Image, Kontext (FLUX.1 dev's
#: recipe), Qwen-Image-Edit (the plus arch's version, 2509 or 2511, comes from ``name_or_path``), Krea 2, Ideogram 4,
#: LTX-2. A profile that is not bundled makes `check` say "not checked".
CHECK_ONLY: dict[str, str] = {
    "flux2": "flux2-dev", "flux2_klein_4b": "flux2-klein-4b", "flux2_klein_9b": "flux2-klein-9b", "zimage": "z-image",
    "flux_kontext": "flux-dev", "qwen_image_edit": "qwen-image-edit", "qwen_image_edit_plus": "qwen-image-edit-2509",
    "krea2": "krea2", "ideogram4": "ideogram4", "ltx2": "ltx2", "ltx2.3": "ltx2",
}  # fmt: skip
#: Archs ai-toolkit runs as another one (Flex.1 is a FLUX.1 model).
ALIASES: dict[str, str] = {"flex1": "flux"}
#: ``is_*`` flags of configs without ``model.arch`` -> arch, first set flag wins; then ``is_pixart``; none: sd1.
FLAGS: tuple[tuple[str, str], ...] = (
    ("is_xl", "sdxl"), ("is_v3", "sd3"), ("is_flux", "flux"), ("is_pixart_sigma", "pixart_sigma"),
    ("is_auraflow", "auraflow"), ("is_lumina2", "lumina2"), ("is_v2", "sd2"), ("is_pixart", "pixart"),
)
#: The ``model:`` keys :func:`arch_of` reads.
MODEL_KEYS: tuple[str, ...] = ("arch", "name_or_path", *(flag for flag, _ in FLAGS))


def arch_name(model: Mapping[str, object]) -> str:
    """``model.arch`` without its mode suffix (``"wan22_14b:t2v"`` -> ``"wan22_14b"``); "" when unset."""
    return str(model.get("arch") or "").split(":")[0]


def flag_arch(model: Mapping[str, object]) -> str | None:
    """The arch the first set ``is_*`` flag names (None: no flag set)."""
    return next((arch for flag, arch in FLAGS if model.get(flag)), None)


def arch_of(model: Mapping[str, object]) -> str | None:
    """The arch a ``model:`` section trains, aliases resolved (None: nothing to tell, no ``name_or_path`` either)."""
    arch = arch_name(model)
    if arch:
        return ALIASES.get(arch, arch)
    flagged = flag_arch(model)
    if flagged is not None:
        return flagged
    return "sd1" if model.get("name_or_path") else None


def hooked_archs() -> list[str]:
    """The archs te-align's hooks encode by a profile (aliases left out), sorted, for messages."""
    return sorted(a for a, (_, hooked) in ARCHS.items() if hooked and a not in ALIASES)


def hooked_profile(model: Mapping[str, object]) -> str | None:
    """The bundled profile the hooks use for a ``model:`` section (None: no profile for its arch)."""
    arch = arch_of(model)
    name = str(model.get("name_or_path") or "").lower()
    if arch == "pixart" and model.get("is_pixart_sigma"):  # arch: pixart with is_pixart_sigma: true
        return ARCHS["pixart_sigma"][0]
    if arch is None or not ARCHS.get(arch, ("", False))[1]:
        return None
    if arch == "flux":
        return "flux-schnell" if "schnell" in name else "flux-dev"
    if arch == "sd3":
        if "3.5-medium" in name or "35-medium" in name or "3.5_medium" in name:
            return "sd35-medium"
        if "3-medium" in name:
            return "sd3-medium"
    return ARCHS[arch][0]

