"""Hugging Face interop: RoFormer checkpoints in (``hf.py``; ``converted.py`` stores a conversion)
and out (``export.py``). Sits above ``models`` and ``data`` and below ``training``."""
