"""The PyTorch rollout engine (``engine.TorchRolloutEngine``) and its parts: the static decoder and its
CUDA graphs (``static_decoder``), decode attention (``decode_attention`` over ``_decode_kernels``),
sampling (``sampling`` over ``sampling_kernel``), the bookkeeping kernel between decode steps
(``step_kernel``), stop strings and regexes (``stops``) and incremental detokenization
(``detokenize``). The GPU kernels are Triton's, imported lazily: the CPU path works without Triton.
"""
