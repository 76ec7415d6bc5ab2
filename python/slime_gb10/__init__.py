"""slime-gb10: GRPO post-training and NVFP4 on NVIDIA DGX Spark (GB10).

Importing this package changes nothing in the process: the GB10 runtime fixes are
applied only by an explicit ``slime_gb10.platform.apply_runtime_fixes()`` (the CLI
calls it for you).
"""

__version__ = "0.1.0"
