"""The Megatron-core policy backend (GB10 production): ``backend`` (the PolicyBackend), ``model``
(GPTModel construction, optimizer, TransformerEngine precision recipes, logprobs) and ``mapping``
(Hugging Face <-> Megatron names and layouts, pure torch). Importing ``backend`` or ``model`` needs
megatron-core; ``mapping`` imports anywhere."""
