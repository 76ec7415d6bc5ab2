"""``python -m slime_gb10.platform.probes.omegaconf_parse``: an OmegaConf interpolation, which runs its
ANTLR grammar (antlr4 runtime 4.13 breaks it: blocker #13); one JSON line."""

import json


def main() -> None:
    from omegaconf import OmegaConf

    value = OmegaConf.create({"a": "${b}", "b": 7}).a
    print(json.dumps({"value": value}))


if __name__ == "__main__":
    main()
