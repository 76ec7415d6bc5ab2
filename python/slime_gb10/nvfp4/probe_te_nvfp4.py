"""``python -m slime_gb10.nvfp4.probe_te_nvfp4``: whether TransformerEngine offers NVFP4 here and has
the ``NVFP4BlockScaling`` recipe with ``disable_rht`` (one JSON line; the doctor's ``te_nvfp4`` check)."""

import dataclasses
import json


def main() -> None:
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    fn = getattr(te, "is_nvfp4_available", None)
    if fn is not None:
        ok, reason = fn(return_reason=True)
    else:
        from transformer_engine.pytorch import fp8

        ok, reason = fp8.check_nvfp4_support()
    cls = getattr(recipe, "NVFP4BlockScaling", None)
    fields = (
        [f.name for f in dataclasses.fields(cls)] if cls is not None and dataclasses.is_dataclass(cls) else []
    )
    print(
        json.dumps(
            {
                "available": bool(ok),
                "reason": reason,
                "has_recipe": cls is not None,
                "has_disable_rht": "disable_rht" in fields,
            }
        )
    )


if __name__ == "__main__":
    main()
