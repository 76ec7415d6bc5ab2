# The fake nixpkgs of a revision from before PR #525141: no python3Packages.sglang / sglang-kernel.
args: import ./. (args // { withSglang = false; })
