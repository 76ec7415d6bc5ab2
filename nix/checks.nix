# checks.<system>: what `nix flake check` builds, in the normal sandbox of any machine (no GPU; the
# GPU checks are packages.<system>.gpu-checks, nix/gpu-checks.nix).
#
#   cpu-pytest            the pytest suite without `gpu` tests (tests/nix included)
#   cpu-ruff              ruff check + ruff format --check
#   cpu-nix-static        tests/nix alone (parse, undefined variables, pure functions, versions)
#   cpu-sm121a-compile    blocker 1 and the run-time compilers, without a GPU: Triton compiles a
#                         kernel for cuda:121 with the environment's ptxas settings, and nvcc from
#                         the environment's one CUDA_HOME compiles a source that uses CCCL, cuBLAS
#                         and cuRAND headers for sm_121a; cuobjdump reads sm_121a back from both
#   cpu-sgl-kernel-patch  the pinned sgl-kernel source + nixpkgs' patches + ours apply, option present
{
  lib,
  runCommand,
  stdenvNoCC,
  nix,
  ruff,
  slime-gb10-env,
  slime-gb10-python,
  slime-gb10-sglang,
  src,
}:
let
  testTools = [
    slime-gb10-env
    ruff
    nix # nix-instantiate for tests/nix
  ];
  prologue = import ./check-prologue.nix src;
in
{
  cpu-pytest = runCommand "slime-gb10-cpu-pytest" { nativeBuildInputs = testTools; } ''
    ${prologue}
    python -m pytest -q -m "not gpu" -p no:cacheprovider tests
    touch $out
  '';

  cpu-ruff = runCommand "slime-gb10-cpu-ruff" { nativeBuildInputs = [ ruff ]; } ''
    cd ${src}
    ruff check --no-cache .
    ruff format --no-cache --check .
    touch $out
  '';

  cpu-nix-static = runCommand "slime-gb10-cpu-nix-static" { nativeBuildInputs = testTools; } ''
    ${prologue}
    python -m pytest -q -p no:cacheprovider tests/nix
    touch $out
  '';

  # The environment's wrapper sets TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH and CUDA_HOME
  # exactly as for a user; `aot` fails unless both cubins are sm_121a.
  cpu-sm121a-compile = runCommand "slime-gb10-cpu-sm121a-compile" { nativeBuildInputs = [ slime-gb10-env ]; } ''
    ${prologue}
    python -m slime_gb10.platform.aot triton cuda --arch 121 | tee $TMPDIR/aot.txt
    grep -q "ok    triton: .* sm_121a" $TMPDIR/aot.txt
    grep -q "ok    cuda: .* sm_121a" $TMPDIR/aot.txt
    touch $out
  '';

}
# The patch applies to the exact source the flake builds (after nixpkgs' own patches); only where
# the pinned nixpkgs has sglang-kernel (else the environment takes upstream's wheel: no source).
// lib.optionalAttrs slime-gb10-sglang.kernelFromSource {
  cpu-sgl-kernel-patch = stdenvNoCC.mkDerivation {
    name = "slime-gb10-cpu-sgl-kernel-patch";
    inherit (slime-gb10-python.pkgs.sglang-kernel) src patches sourceRoot;
    dontConfigure = true;
    dontBuild = true;
    installPhase = ''
      grep -q '^option(SGL_KERNEL_GB10_ONLY' CMakeLists.txt
      grep -q 'list(FILTER SGL_KERNEL_CUDA_FLAGS EXCLUDE REGEX "^-gencode=")' CMakeLists.txt
      install -Dm444 CMakeLists.txt $out/CMakeLists.txt
    '';
  };
}
