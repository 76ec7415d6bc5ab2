# checks.<system>: what `nix flake check` builds.
#
# cpu-*  build in the normal sandbox on any machine of that system (no GPU):
#   cpu-pytest          the pytest suite without `gpu` tests (tests/nix included)
#   cpu-ruff            ruff check + ruff format --check
#   cpu-nix-static      tests/nix alone (parse, undefined variables, pure functions, versions)
#   cpu-ptxas-sm121a    the closure's ptxas accepts sm_121a (blocker 1) and is CUDA 13
#   cpu-sgl-kernel-patch  the pinned sgl-kernel source + nixpkgs' patches + ours apply, option present
# gpu-*  need a GPU runner: requiredSystemFeatures = [ "cuda" ] (nix/README.md "GPU runner"):
#   gpu-doctor          `slime-gb10 doctor` exits 0
#   gpu-pytest          pytest -m gpu tests/platform tests/nvfp4 tests/grpo
#                       (Triton JIT on sm_121a, NVFP4Linear TE path vs reference, an sgl-kernel op,
#                       one GRPO step on a tiny model)
{
  lib,
  runCommand,
  stdenvNoCC,
  nix,
  ruff,
  cudaPackages,
  python3Packages,
  slime-gb10-env,
  src,
}:
let
  # The whole repository (flake `self` is already filtered to tracked files).
  repo = src;

  python = slime-gb10-env.python;

  testTools = [
    slime-gb10-env
    ruff
    nix # nix-instantiate for tests/nix
  ];

  # Common prologue: writable HOME, offline Hugging Face, and a private Nix store/state for
  # nix-instantiate inside the sandbox (as nixpkgs' own lib tests do).
  prologue = ''
    export HOME=$TMPDIR/home XDG_CACHE_HOME=$TMPDIR/cache
    export NIX_CONF_DIR=$TMPDIR/nix/etc NIX_LOCALSTATE_DIR=$TMPDIR/nix/var
    export NIX_LOG_DIR=$TMPDIR/nix/var/log NIX_STATE_DIR=$TMPDIR/nix/var/nix
    export NIX_STORE_DIR=$TMPDIR/nix/store NIX_BUILD_HOOK= PAGER=cat
    mkdir -p "$HOME" "$XDG_CACHE_HOME" "$NIX_CONF_DIR"
    nix-store --init
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1
    cp -r ${repo} repo && chmod -R u+w repo && cd repo
    export PYTHONPATH=$PWD/python
  '';

  gpuCheck =
    name: script:
    runCommand "slime-gb10-${name}"
      {
        nativeBuildInputs = testTools;
        requiredSystemFeatures = [ "cuda" ];
      }
      ''
        ${prologue}
        ${slime-gb10-env.setupEnv}
        ${script}
        touch $out
      '';
in
{
  cpu-pytest = runCommand "slime-gb10-cpu-pytest" { nativeBuildInputs = testTools; } ''
    ${prologue}
    python -m pytest -q -m "not gpu" -p no:cacheprovider tests
    touch $out
  '';

  cpu-ruff = runCommand "slime-gb10-cpu-ruff" { nativeBuildInputs = [ ruff ]; } ''
    cd ${repo}
    ruff check --no-cache .
    ruff format --no-cache --check .
    touch $out
  '';

  cpu-nix-static = runCommand "slime-gb10-cpu-nix-static" { nativeBuildInputs = testTools; } ''
    ${prologue}
    python -m pytest -q -p no:cacheprovider tests/nix
    touch $out
  '';

  # Blocker 1 by construction: the ptxas Triton and the devShell use is CUDA 13 and knows sm_121a.
  cpu-ptxas-sm121a = runCommand "slime-gb10-cpu-ptxas-sm121a" { } ''
    ptxas=${lib.getExe' cudaPackages.cuda_nvcc "ptxas"}
    "$ptxas" --version | tee version.txt
    grep -q "release 13\." version.txt
    "$ptxas" --help | grep -q "sm_121a"
    [ "$ptxas" = "${slime-gb10-env.runtimeEnv.TRITON_PTXAS_PATH}" ]
    touch $out
  '';

  # The patch applies to the exact source the flake builds (after nixpkgs' own patches).
  cpu-sgl-kernel-patch = stdenvNoCC.mkDerivation {
    name = "slime-gb10-cpu-sgl-kernel-patch";
    inherit (python3Packages.sglang-kernel) src patches sourceRoot;
    dontConfigure = true;
    dontBuild = true;
    installPhase = ''
      grep -q '^option(SGL_KERNEL_GB10_ONLY' CMakeLists.txt
      grep -q 'list(FILTER SGL_KERNEL_CUDA_FLAGS EXCLUDE REGEX "^-gencode=")' CMakeLists.txt
      install -Dm444 CMakeLists.txt $out/CMakeLists.txt
    '';
  };

  gpu-doctor = gpuCheck "gpu-doctor" ''
    slime-gb10 doctor
  '';

  gpu-pytest = gpuCheck "gpu-pytest" ''
    python -m pytest -q -m gpu -p no:cacheprovider tests/platform tests/nvfp4 tests/grpo
  '';
}
