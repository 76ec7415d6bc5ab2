# devShells.<system>.default: the slime-gb10 environment plus the CUDA 13 toolchain.
#
#   nvcc, ptxas, cuobjdump, nvdisasm from the same cudaPackages the closure was built with;
#   TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH, CUDA_HOME, TORCH_CUDA_ARCH_LIST,
#   PYTORCH_ALLOC_CONF (nix/gb10.nix runtimeEnv) for the whole shell;
#   the host NVIDIA driver NOT for the whole shell: the environment's wrappers (python, slime-gb10,
#   pytest come first on PATH) give it to each program they start (nixglhost on non-NixOS hosts;
#   see nix/packages/slime-gb10-env.nix). `nixglhost <cmd>` is on PATH for anything else.
{
  lib,
  mkShell,
  cudaPackages,
  slime-gb10-env,
  nixglhost ? null,
  ruff,
}:
# nvcc only accepts some gcc versions: the shell's compiler is the CUDA set's backendStdenv one.
(mkShell.override { stdenv = cudaPackages.backendStdenv; }) {
  name = "slime-gb10-dev";

  packages = [
    slime-gb10-env
    cudaPackages.cuda_nvcc # nvcc, ptxas
    cudaPackages.cuda_cuobjdump
    cudaPackages.cuda_nvdisasm
    ruff
  ]
  ++ lib.optional (nixglhost != null) nixglhost;

  shellHook = ''
    ${slime-gb10-env.setupEnv}
    if [ -e pyproject.toml ] && [ -d python/slime_gb10 ]; then
      # Work on the checkout: its python/ shadows the packaged slime_gb10.
      export PYTHONPATH="$PWD/python''${PYTHONPATH:+:$PYTHONPATH}"
    fi
    echo "slime-gb10 dev shell (CUDA ${cudaPackages.cudaMajorMinorVersion or "13"}, TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST): run 'slime-gb10 doctor' to check the GPU stack."
  '';
}
