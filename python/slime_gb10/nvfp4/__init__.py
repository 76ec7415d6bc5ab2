"""NVFP4 exact to NVIDIA's format: reference and Triton kernels, ``NVFP4Linear``, ModelOpt checkpoints."""
