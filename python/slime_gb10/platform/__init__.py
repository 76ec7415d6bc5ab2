"""GB10 platform: device facts and peak rates, runtime fixes, and ``slime-gb10 doctor``."""
