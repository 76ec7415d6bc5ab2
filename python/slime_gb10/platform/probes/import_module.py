"""``python -m slime_gb10.platform.probes.import_module MODULE``: import MODULE; its version and file
as one JSON line (the doctor's package checks: an import that crashes takes only this child down)."""

import importlib
import json
import sys


def main() -> None:
    module = importlib.import_module(sys.argv[1])
    print(
        json.dumps(
            {"version": getattr(module, "__version__", None), "file": getattr(module, "__file__", None)}
        )
    )


if __name__ == "__main__":
    main()
