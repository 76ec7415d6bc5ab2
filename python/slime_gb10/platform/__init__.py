"""GB10 platform: device facts and peak rates, runtime fixes, and ``slime-gb10 doctor``.

Importing this package changes nothing (no environment variable, no torch import): the runtime
fixes run only when :func:`apply_runtime_fixes` is called (the ``slime-gb10`` CLI calls it).
"""

from slime_gb10.platform.devices import DevicePeaks, device_peaks, lookup_peaks, mfu, sm_arch
from slime_gb10.platform.fixes import FIX_NAMES, AppliedFix, apply_runtime_fixes
from slime_gb10.platform.probe import DeviceFacts

__all__ = [
    "FIX_NAMES",
    "AppliedFix",
    "DeviceFacts",
    "DevicePeaks",
    "apply_runtime_fixes",
    "device_peaks",
    "lookup_peaks",
    "mfu",
    "sm_arch",
]
