"""Probes: small programs the doctor and the runtime fixes run as ``python -m slime_gb10.platform.probes.X``
in a child process (a hang or crash in CUDA, an import or a collective never takes the parent down),
each printing one JSON line last. Real modules, so linters, tests and readers see them. The probes
of a higher layer live beside their subject (``slime_gb10.nvfp4.probe_*``, ``slime_gb10.grpo.probe_*``)."""
