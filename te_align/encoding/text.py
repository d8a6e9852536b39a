"""Text preprocessing before tokenization: cleaning and prompt templates (no torch)."""

from __future__ import annotations

import html
import logging
import re

from te_align.profiles.model import TokenizerSpec

_WS = re.compile(r"\s+")
#: Quote pairs of the ``quoted_text`` transform, searched in this order (non-greedy, per pair).
_QUOTES = tuple(re.compile(re.escape(a) + "(.*?)" + re.escape(b)) for a, b in (("'", "'"), ('"', '"'), ("\u2018", "\u2019"), ("\u201c", "\u201d")))


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("te_align").warning(message)


def _unescape_twice(text: str) -> str:
    return html.unescape(html.unescape(text))


def clean_basic(text: str) -> str:
    """ftfy repair (when installed), HTML unescaped twice, whitespace runs collapsed, ends stripped.

    The cleaning the Wan 2.1 pipeline applies (diffusers ``pipelines/wan``: ``basic_clean`` then
    ``whitespace_clean``).
    """
    try:
        import ftfy
    except ImportError:  # pragma: no cover - ftfy is a dependency
        ftfy = None
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = _unescape_twice(text).strip()
    return _WS.sub(" ", text).strip()


def clean_pixart(text: str) -> str:
    """The PixArt / DeepFloyd caption cleaner, as the diffusers PixArt pipelines run it.

    The cleaner is a long list of regular expressions tuned on LAION captions; to stay exactly equal
    to the official pipeline we call the pipeline's own method rather than keep a drifting copy.
    It needs ``beautifulsoup4`` and ``ftfy`` (as in diffusers, which otherwise skips cleaning).
    """
    from diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha import PixArtAlphaPipeline
    from diffusers.utils import is_bs4_available, is_ftfy_available

    if not (is_bs4_available() and is_ftfy_available()):
        # Same fallback as the pipeline: no cleaning when its dependencies are missing; said once, not silently.
        _warn_once("te-align: PixArt caption cleaning needs beautifulsoup4 and ftfy (pip install \"te-align[encode]\"); "
                   "without them prompts are only lower-cased and stripped, as the diffusers pipeline does")
        return text.lower().strip()
    # _clean_caption reads only class-level regexes from ``self``; the pipeline runs it twice.
    owner = PixArtAlphaPipeline
    return owner._clean_caption(owner, owner._clean_caption(owner, text))  # type: ignore[arg-type]


def clean(text: str, mode: str) -> str:
    if mode == "none":
        return text
    if mode in ("basic", "wan"):
        return clean_basic(text)
    if mode == "pixart":
        return clean_pixart(text)
    if mode == "lower":
        return text.lower().strip()
    if mode == "drop_img_tokens":
        return text.replace("[IMG]", "")  # FLUX.2's format_input: [IMG] would break the Pixtral processor's count
    if mode == "strip":
        return text.strip()  # LTX-2: prompt = [p.strip() for p in prompt]
    raise ValueError(f"unknown text_cleaning {mode!r}")  # validated by the profile schema


def quoted_text(prompt: str) -> str | None:
    """The quoted spans of a prompt as glyph text, or None when it has none.

    Every span in '...', then "...", then ‘...’, then “...” (each pair searched on its own,
    shortest match), written as ``Text "span"``, joined with ". " and ended with ". ". The glyph
    text HunyuanImage-2.1 gives its ByT5 encoder (diffusers ``pipelines/hunyuan_image``
    ``extract_glyph_text``).
    """
    spans = [m for pattern in _QUOTES for m in pattern.findall(prompt)]
    if not spans:
        return None
    return ". ".join(f'Text "{x}"' for x in spans) + ". "


def slot_text(spec: TokenizerSpec, prompt: str) -> str | None:
    """The part of a prompt this slot encodes (``text_transform``); None when there is none."""
    if spec.text_transform == "none":
        return prompt
    if spec.text_transform == "quoted_text":
        return quoted_text(prompt)
    raise ValueError(f"unknown text_transform {spec.text_transform!r}")  # validated by the profile schema


def is_absent(spec: TokenizerSpec, prompt: str) -> bool:
    """The prompt has no text for this slot and the slot encodes nothing for it (``absent_text = "zeros"``)."""
    return spec.absent_text == "zeros" and slot_text(spec, prompt) is None


def render(spec: TokenizerSpec, prompt: str, *, negative: bool = False) -> str:
    """Transform and clean a prompt and wrap it in the slot's template (or negative template).

    A prompt without text for the slot (``text_transform``) renders as the empty string would.
    """
    template = _fill(spec, spec.negative_template if negative else spec.template)
    text = clean(slot_text(spec, prompt) or "", spec.text_cleaning)
    return template.replace("{prompt}", text)


def _fill(spec: TokenizerSpec, template: str) -> str:
    """The template's ``{system_prompt}`` and ``{thinking}`` places filled in (the prompt's is left)."""
    thinking = spec.thinking_off_text if spec.enable_thinking is False else ""
    return template.replace("{system_prompt}", spec.system_prompt or "").replace("{thinking}", thinking)


def template_prefix(spec: TokenizerSpec, *, negative: bool = False) -> str:
    """The part of the template before ``{prompt}`` (e.g. Sana's instruction block)."""
    template = spec.negative_template if negative else spec.template
    return _fill(spec, template.split("{prompt}", 1)[0])


def template_suffix(spec: TokenizerSpec, *, negative: bool = False) -> str:
    """The part of the template after ``{prompt}`` (empty when the template has no ``{prompt}``)."""
    template = spec.negative_template if negative else spec.template
    after = template.split("{prompt}", 1)[1] if "{prompt}" in template else ""
    return _fill(spec, after)
