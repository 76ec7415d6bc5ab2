"""Hopper-only (sm_90a) parts of the NVFP4 kernels: the ``wgmma`` W4A16 kernel and the thresholds
measured on the H100 that choose it. A GB10 (sm_121) never runs them."""
