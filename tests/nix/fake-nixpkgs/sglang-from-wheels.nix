# The fake nixpkgs of a revision without python3Packages.sglang / sglang-kernel but with everything
# sglang needs (flashinfer, xgrammar, ...) and torch 2.11: the wheel fallbacks fit.
args: import ./. (args // { withSglang = false; withSglangDependencies = true; })
