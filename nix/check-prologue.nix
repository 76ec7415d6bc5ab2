# The shell lines every check starts with (nix/checks.nix, nix/gpu-checks.nix): a writable HOME and
# caches, offline Hugging Face, a private Nix store/state for nix-instantiate inside the sandbox (as
# nixpkgs' own lib tests do), and a writable copy of the repository as the working directory, whose
# python/ shadows the packaged slime_gb10.
repo: ''
  export HOME=$TMPDIR/home XDG_CACHE_HOME=$TMPDIR/cache TRITON_CACHE_DIR=$TMPDIR/triton
  export NIX_CONF_DIR=$TMPDIR/nix/etc NIX_LOCALSTATE_DIR=$TMPDIR/nix/var
  export NIX_LOG_DIR=$TMPDIR/nix/var/log NIX_STATE_DIR=$TMPDIR/nix/var/nix
  export NIX_STORE_DIR=$TMPDIR/nix/store NIX_BUILD_HOOK= PAGER=cat
  mkdir -p "$HOME" "$XDG_CACHE_HOME" "$NIX_CONF_DIR"
  if command -v nix-store >/dev/null; then nix-store --init; fi
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1
  cp -r ${repo} repo && chmod -R u+w repo && cd repo
  export PYTHONPATH=$PWD/python
''
