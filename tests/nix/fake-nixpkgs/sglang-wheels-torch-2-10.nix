# As sglang-from-wheels.nix, but with torch 2.10: the sglang-kernel wheel (built against torch
# 2.11's C++ ABI) cannot load, so the full environment is refused.
args: import ./. (args // { withSglang = false; withSglangDependencies = true; torchVersion = "2.10.1"; })
