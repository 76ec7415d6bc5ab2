# The fake nixpkgs of a revision whose _cuda has no lib.allowUnfreeCudaPredicate.
args: import ./. (args // { withCudaPredicate = false; })
