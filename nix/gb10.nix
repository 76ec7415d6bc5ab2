# GB10 (DGX Spark) hardware facts and the CUDA arch flags derived from them: ONE place.
#
# Pure Nix, builtins only (no nixpkgs, no lib), so tests/nix/ can evaluate every function here with a
# bare `nix-instantiate --eval --strict`. The overlay, the devShell and the checks read everything
# architecture-related from this file; nothing else spells "121" by hand.
#
# Capability notation follows nixpkgs (pkgs/development/cuda-modules/_cuda/data/cuda.nix):
# "12.1" is the baseline, "12.1a" the arch-specific and "12.1f" the family-specific feature set.
let
  inherit (builtins)
    concatStringsSep
    elem
    filter
    fromJSON
    readFile
    length
    replaceStrings
    substring
    stringLength
    ;

  # "12.1" -> "121"; also accepts "12.1a" -> "121a".
  dropDot = capability: replaceStrings [ "." ] [ "" ] capability;

  hasPrefix = prefix: s: substring 0 (stringLength prefix) s == prefix;

  anyPrefix = prefixes: s: length (filter (p: hasPrefix p s) prefixes) > 0;
in
rec {
  # ---- the machine ---------------------------------------------------------------------------
  # The facts themselves live in python/slime_gb10/platform/gb10.json, which the Python package
  # reads too (devices.py, the doctor): one source. Nix adds what only Nix needs.
  hardware = fromJSON (readFile ../python/slime_gb10/platform/gb10.json) // {
    system = "aarch64-linux"; # Grace: 10x Cortex-X925 + 10x Cortex-A725, SBSA
    os = "DGX OS (Ubuntu 24.04), not NixOS";
  };

  # ---- the toolchain -------------------------------------------------------------------------
  # CUDA 12.x ptxas has no sm_121a (blocker 1): the whole package set uses CUDA 13.
  # 13.2 is the set graham33/nixos-dgx-spark builds in CI at the same nixpkgs revision.
  cuda = {
    majorMinor = "13.2";
    packageSet = "cudaPackages_13_2";
  };

  # ---- the interpreter ------------------------------------------------------------------------
  # Pinned, not nixpkgs' `python3`: at a 2026 revision that default may be 3.14, on which nixpkgs'
  # triton disables 13 GPU tests (CompilationError: `ast.Num` is gone, hit by ordinary loop
  # kernels), and megatron-core / TransformerEngine are not tested on 3.14. 3.13 is what nixpkgs'
  # CUDA Python packages are built and tested with through 2026 (megatron-core >= 0.17 needs >= 3.12).
  python = {
    attr = "python313";
    version = "3.13";
  };

  # ---- arch-flag functions (all pure) --------------------------------------------------------
  # "12.1" -> "sm_121"
  smArch = capability: "sm_${dropDot capability}";

  # "12.1" -> "sm_121a" (arch-specific: needed for the NVFP4 tensor-core instructions)
  archSpecific = capability: "sm_${dropDot capability}a";

  # "12.1" -> "121f" (family target, TransformerEngine's NVTE_CUDA_ARCHS, blocker 8)
  familyTarget = capability: "${dropDot capability}f";

  # "12.1" -> "-gencode=arch=compute_121a,code=sm_121a" (sgl-kernel's SGL_KERNEL_CUDA_FLAGS style)
  gencode = capability: "-gencode=arch=compute_${dropDot capability}a,code=sm_${dropDot capability}a";

  # ["12.0" "12.1"] -> "12.0;12.1"; with arch-specific suffix: "12.0a;12.1a"
  torchCudaArchList = capabilities: concatStringsSep ";" capabilities;
  torchCudaArchListSpecific = capabilities: concatStringsSep ";" (map (c: "${c}a") capabilities);

  # ["12.0" "12.1"] -> "120f;121f"
  nvteCudaArchs = capabilities: concatStringsSep ";" (map familyTarget capabilities);

  # ["12.0" "12.1"] -> "120a;121a" (CMAKE_CUDA_ARCHITECTURES syntax)
  cmakeCudaArchitectures = capabilities: concatStringsSep ";" (map (c: "${dropDot c}a") capabilities);

  # ["12.0" "12.1"] -> the two -gencode flags sgl-kernel keeps under SGL_KERNEL_GB10_ONLY
  sglKernelGencodes = capabilities: map gencode capabilities;

  # How many memory-hungry compile jobs fit: (memory - reserve) / per-job, at least 1.
  # cicc on CUTLASS FP8/FP4 GEMM translation units peaks at ~10-15 GB per arch (slime PR #1835).
  maxParallelJobs =
    {
      memoryGiB,
      perJobGiB,
      reserveGiB ? 16,
    }:
    let
      n = (memoryGiB - reserveGiB) / perJobGiB;
    in
    if n < 1 then 1 else n;

  # ---- per-system build profiles -------------------------------------------------------------
  # The flake serves GB10 (aarch64-linux, the target) and x86_64 Hopper/Blackwell servers.
  profiles = {
    gb10 = rec {
      # What nixpkgs compiles device code for (config.cudaCapabilities). sm_120 SASS also runs on
      # sm_121 (binary compatible), but 12.1 is the machine.
      cudaCapabilities = [ "12.1" ];
      # What sgl-kernel (arch-specific `a` cubins) and TransformerEngine (family `f` targets) are
      # compiled for: the GB10's own 12.1 only. sm_120a cubins never run on a GB10, and one family
      # target is enough (nixpkgs' TE drops "12.1" from its list for the same reason: 120f covers
      # it). Add "12.0" here to also serve RTX 50xx / RTX PRO 6000 from the same build.
      familyCapabilities = [ "12.1" ];
      sglKernelGb10Only = true; # blocker 5: only familyCapabilities (sm_121a), no FA3
      # nvcc --threads per job x parallel jobs: 2 x 4 = 8 cicc processes at ~12 GB peak each
      # stays under the 128 GB of unified memory with a reserve for the OS.
      sglKernelNvccThreads = 2;
      sglKernelJobs = maxParallelJobs {
        memoryGiB = hardware.memoryGiB;
        perJobGiB = 12 * sglKernelNvccThreads;
      };
      transformerEngineJobs = maxParallelJobs {
        memoryGiB = hardware.memoryGiB;
        perJobGiB = 8;
      };
    };
    server = {
      # H100/H200 (9.0), B200 (10.0), RTX PRO 6000 / RTX 50xx (12.0).
      cudaCapabilities = [
        "9.0"
        "10.0"
        "12.0"
      ];
      familyCapabilities = [
        "10.0"
        "12.0"
      ];
      sglKernelGb10Only = false;
      sglKernelNvccThreads = 4;
      sglKernelJobs = 8;
      transformerEngineJobs = 16;
    };
  };

  profileFor = system: if system == "aarch64-linux" then profiles.gb10 else profiles.server;

  # ---- nixpkgs config ------------------------------------------------------------------------
  # Unfree packages we accept: the CUDA redistributables and NVIDIA's own libraries, by name.
  # Everything else stays under nixpkgs' default (unfree refused).
  unfreeNamePrefixes = [
    "cuda_"
    "cuda-"
    "cudatoolkit"
    "cudnn"
    "libcu"
    "libnv"
    "libnpp"
    "nccl"
    "cutensor"
    "cusparselt"
    "tensorrt"
    "nvidia-"
    "nvidia_"
    "nvtx"
    "nvshmem"
    "nvcomp"
    "nvpl"
    "cudss"
    "cuquantum"
    "driver_assistant"
  ];

  isAllowedUnfree = name: anyPrefix unfreeNamePrefixes name;

  # The nixpkgs `config` for a system. `getName` is lib.getName (a package -> its pname); passed in
  # so this file needs no lib. `cudaPredicate`: nixpkgs' licence-based
  # `_cuda.lib.allowUnfreeCudaPredicate` where the pinned revision has it (the flake passes
  # `pkgs._cuda.lib.allowUnfreeCudaPredicate or null`, read lazily, when a package is checked). It
  # accepts NVIDIA's CUDA licences only, not the `unfreeRedistributable` of NVIDIA's Python
  # packages (nvidia-cutlass-dsl, cuda-bindings: tests/nix/nixpkgs-facts.json), which the name
  # prefixes above accept: a package passes if either does.
  nixpkgsConfigFor =
    {
      system,
      getName,
      cudaPredicate ? null,
    }:
    {
      cudaSupport = true;
      cudaCapabilities = (profileFor system).cudaCapabilities;
      # Keep PTX for the newest capability so a later driver can JIT it for newer GPUs.
      cudaForwardCompat = true;
      allowUnfreePredicate =
        pkg: (cudaPredicate != null && cudaPredicate pkg) || isAllowedUnfree (getName pkg);
    };

  # ---- runtime environment -------------------------------------------------------------------
  # The variables the devShell exports and the `slime-gb10` wrapper sets (blocker 1 runtime side,
  # unified-memory allocator). `ptxas` and `cudaHome` are store paths given by the caller.
  runtimeEnv =
    {
      ptxas,
      cudaHome,
      system ? hardware.system,
    }:
    {
      # Triton < 3.5 (and sm < 100) reads TRITON_PTXAS_PATH; Triton >= 3.5 takes the ptxas for sm_100+
      # (GB10 included) from TRITON_PTXAS_BLACKWELL_PATH (knobs.nvidia.ptxas_blackwell) and ignores
      # the other there. Both name the closure's CUDA 13 ptxas, whatever nixpkgs' triton patches do.
      TRITON_PTXAS_PATH = ptxas;
      TRITON_PTXAS_BLACKWELL_PATH = ptxas;
      CUDA_HOME = cudaHome;
      CUDA_PATH = cudaHome;
      TORCH_CUDA_ARCH_LIST =
        if system == "aarch64-linux" then
          torchCudaArchListSpecific [ hardware.capability ]
        else
          torchCudaArchList (profileFor system).cudaCapabilities;
      PYTORCH_ALLOC_CONF = "expandable_segments:True";
    };

  # Shell lines exporting each variable of `env` unless the user already set it:
  # { A = "1"; } gives the line: export A="${A:-1}". Used by the wrappers and the devShell.
  shellExports =
    env:
    concatStringsSep "" (
      map (name: "export ${name}=\"\${${name}:-${env.${name}}}\"\n") (builtins.attrNames env)
    );

  # Is `x` one of the GB10 family capabilities? (used by checks to refuse silly overrides)
  isFamilyCapability = capability: elem capability profiles.gb10.familyCapabilities;
}
