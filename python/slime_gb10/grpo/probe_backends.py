"""``python -m slime_gb10.grpo.probe_backends``: whether the SGLang engine and the Megatron
backend can run here, each ``[ok, why]`` (one JSON line; the doctor's ``grpo_backends`` check)."""

import importlib
import json


def main() -> None:
    out = {}
    for name, module in (
        ("sglang", "slime_gb10.grpo.engines.sglang_engine"),
        ("megatron", "slime_gb10.grpo.backends.megatron.backend"),
    ):
        try:
            out[name] = list(importlib.import_module(module).availability())
        except Exception as exc:
            out[name] = [False, f"{exc.__class__.__name__}: {exc}"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
