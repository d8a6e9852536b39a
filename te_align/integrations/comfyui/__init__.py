"""te-align's ComfyUI custom nodes ("te-align Text Encode", "te-align Empty Negative").

ComfyUI loads this folder as a custom node package: ``te-align comfyui install /path/to/ComfyUI`` writes a
two-line loader into ``custom_nodes/te-align/`` (a transaction; ``te-align comfyui uninstall`` restores the tree
byte for byte), or link this folder into ``custom_nodes/`` yourself. Either way te-align must be installed in the
Python that runs ComfyUI (``python -m pip install /path/to/te-align``, a clone or a built wheel: the core is
pure Python and uses ComfyUI's own torch and transformers). The nodes call ComfyUI's public objects at run time and copy
none of its code.
"""

from te_align.integrations.comfyui.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
