# A fake nixpkgs for evaluating this flake where nixpkgs cannot be fetched (tests/nix).
#
# It mimics the interfaces the flake relies on (nix/README.md "What we rely on"): `import nixpkgs
# { system; config; overlays; }`, callPackage, pythonPackagesExtensions, overridePythonAttrs,
# `.override` with function args, cudaPackages_13_2 components with split outputs, _cuda.extend,
# python3.withPackages, runCommand / symlinkJoin / mkShell / writeShellScript(Bin). Packages are
# plain attribute sets that remember their arguments, so tests can inspect what the overlay did.
# The nixpkgs package functions themselves are stubs that take the arguments the real ones take
# (transformer-engine: cudaPackages, withJax, withPytorch, ...), read from nixpkgs' source.
{
  system,
  config ? { },
  overlays ? [ ],
  # false: a nixpkgs revision from before PR #525141 (no python3Packages.sglang / sglang-kernel)
  withSglang ? true,
  # false: a revision whose _cuda has no lib.allowUnfreeCudaPredicate
  withCudaPredicate ? true,
  # with withSglang = false: whether the revision has sglang's own dependencies (flashinfer,
  # xgrammar, ...: nixpkgs' list for 0.5.12.post1), which the wheel fallback needs
  withSglangDependencies ? false,
  # python3Packages.torch.version (the sglang-kernel wheel fits 2.11 only)
  torchVersion ? "2.11.0",
}:
let
  libPath = builtins.getEnv "SLIME_GB10_NIXPKGS_LIB";
  lib = if libPath == "" then import ../stub-lib.nix else import libPath;
  b = builtins;

  mkDrv =
    attrs:
    let
      name = attrs.name or "${attrs.pname}-${attrs.version or "0"}";
      outputs = attrs.outputs or [ "out" ];
      # mkDerivation: passthru attributes are attributes of the result, and `passthru` too.
      self =
        attrs
        // (attrs.passthru or { })
        // {
          type = "derivation";
          inherit name outputs;
          outPath = "/nix/store/00000000000000000000000000000000-${name}";
          drvPath = "/nix/store/00000000000000000000000000000000-${name}.drv";
          overrideAttrs = f: mkDrv (attrs // (if b.isFunction f then f attrs else f));
        }
        // b.listToAttrs (
          map (o: {
            name = o;
            value = self // {
              outPath = "/nix/store/00000000000000000000000000000000-${name}-${o}";
              outputName = o;
              outputSpecified = true;
            };
          }) outputs
        );
    in
    self;

  # buildPythonPackage: accepts attrs or (finalAttrs: attrs), like nixpkgs.
  buildPythonPackage =
    attrsOrFn:
    let
      attrs = if b.isFunction attrsOrFn then lib.fix attrsOrFn else attrsOrFn;
      drv = mkDrv attrs;
    in
    drv
    // {
      overridePythonAttrs = f: buildPythonPackage (attrs // (if b.isFunction f then f attrs else f));
    };

  # Every attribute a package function asks for, from `scope`; explicit args win.
  callPackageWith =
    scope: fn: args:
    let
      f = if b.isFunction fn || fn ? __functor then fn else import fn;
      auto = b.intersectAttrs (lib.functionArgs f) scope;
    in
    lib.makeOverridable f (auto // args);

  mkExtensible =
    attrs:
    attrs
    // {
      extend = f: mkExtensible (attrs // f (mkExtensible attrs) attrs);
    };

  cudaComponent =
    pname: outputs:
    mkDrv {
      inherit pname outputs;
      version = "13.2";
      meta.license = "nvidia-cuda"; # what the fake allowUnfreeCudaPredicate accepts
    };

  cudaPackages_13_2 = {
    cudaMajorMinorVersion = "13.2";
    # the stdenv whose gcc nvcc 13.2 supports (pkgs/development/cuda-modules: backendStdenv)
    backendStdenv = {
      name = "cuda-backend-stdenv";
      cc = mkDrv { pname = "gcc-wrapper"; version = "14"; };
    };
    cuda_nvcc = (cudaComponent "cuda_nvcc" [ "out" "bin" "include" ]) // {
      meta = {
        mainProgram = "nvcc";
        license = "nvidia-cuda";
      };
    };
    cuda_cudart = cudaComponent "cuda_cudart" [ "out" "include" "lib" "stubs" ];
    cuda_cccl = cudaComponent "cuda_cccl" [ "out" "include" ];
    cuda_crt = cudaComponent "cuda_crt" [ "out" "include" ];
    cuda_nvrtc = cudaComponent "cuda_nvrtc" [ "out" "include" "lib" ];
    cuda_nvtx = cudaComponent "cuda_nvtx" [ "out" "include" ];
    cuda_profiler_api = cudaComponent "cuda_profiler_api" [ "out" "include" ];
    cuda_cuobjdump = cudaComponent "cuda_cuobjdump" [ "out" "bin" ];
    cuda_nvdisasm = cudaComponent "cuda_nvdisasm" [ "out" "bin" ];
    cudnn = cudaComponent "cudnn" [ "out" "include" "lib" ];
    libcublas = cudaComponent "libcublas" [ "out" "include" "lib" ];
    libcurand = cudaComponent "libcurand" [ "out" "include" "lib" ];
  };

  # pkgs/development/cuda-modules/_cuda/lib/cuda.nix: allowUnfreeCudaPredicate decides by licence;
  # the stub accepts what carries the NVIDIA licence marker the fake's CUDA components would have.
  cudaLib = lib.optionalAttrs withCudaPredicate {
    allowUnfreeCudaPredicate = pkg: (pkg.meta.license or null) == "nvidia-cuda";
  };

  # python3 is the revision's default interpreter (3.14 here, as the pin's may be); python313 the
  # one the flake pins. Both share one package set (what differs is the interpreter's name).
  mkPythonFor = final: version: {
    inherit version;
    pythonVersion = version;
    libPrefix = "python${version}";
    pkgs = final.python3Packages;
    withPackages =
      f:
      mkDrv {
        name = "python${version}-env";
        packages = f final.python3Packages;
      };
  };

  base = final: {
    inherit lib config;
    stdenv = {
      name = "stdenv-linux";
      hostPlatform.system = system;
      cc = mkDrv { pname = "gcc-wrapper"; version = "14"; } // {
        cc = mkDrv { pname = "gcc"; version = "14"; outputs = [ "out" "lib" ]; };
      };
    };
    autoPatchelfHook = mkDrv { name = "auto-patchelf-hook"; };
    numactl = mkDrv { pname = "numactl"; version = "2.0"; };
    callPackage = callPackageWith final;

    cudaPackages_12_9 = throw "fake nixpkgs: the flake must not use CUDA 12";
    inherit cudaPackages_13_2;
    cudaPackages = throw "fake nixpkgs: default cudaPackages (12.x in nixpkgs) used instead of the overlay's";
    # lib.makeExtensible-like: `extend` takes `final: prev: attrs`.
    _cuda = mkExtensible {
      extensions = [ ];
      lib = cudaLib;
    };

    cmake = mkDrv {
      pname = "cmake";
      version = "4.1.2";
    };
    ruff = mkDrv { pname = "ruff"; version = "0.15.0"; meta.mainProgram = "ruff"; };
    nix = mkDrv { pname = "nix"; version = "2.31"; };
    python3 = mkPythonFor final "3.14";
    python313 = mkPythonFor final "3.13";
    python312 = mkPythonFor final "3.12";
    pythonPackagesExtensions = [ ];
    python3Packages = lib.fix (
      b.foldl' (acc: ext: lib.extends ext acc) (pyBase final) final.pythonPackagesExtensions
    );

    runCommand =
      name: env: script:
      mkDrv (env // { inherit name; buildCommand = script; });
    stdenvNoCC.mkDerivation = attrs: mkDrv attrs;
    symlinkJoin = attrs: mkDrv attrs;
    # pkgs/build-support/mkshell: callPackage'd, so `mkShell.override { stdenv = …; }` works
    mkShell = final.callPackage (
      { stdenv }: attrs: mkDrv (attrs // { name = attrs.name or "shell"; stdenvName = stdenv.name; })
    ) { };
    writeShellScript = name: text: mkDrv { inherit name text; };
    linkFarm = name: entries: mkDrv { inherit name entries; };
    writeShellScriptBin =
      name: text:
      mkDrv {
        inherit name text;
        meta.mainProgram = name;
      };
  };

  # The Python package set: stubs with the arguments of nixpkgs' package functions.
  pyBase =
    pkgs: pyFinal:
    let
      callPy = callPackageWith (pkgs // pyFinal);
      simple = pname: mkDrv { inherit pname; version = "1.0"; };
    in
    {
      inherit buildPythonPackage;
      callPackage = callPy;
      # the interpreter of this set (shared by the fake's python3 and python313: see mkPythonFor)
      python = {
        pythonVersion = "3.13";
        sitePackages = "lib/python3.13/site-packages";
      };
      # pkgs/build-support/fetchpypi: sdist by default, or a wheel with format/dist/python/abi/platform
      fetchPypi =
        {
          pname,
          version,
          hash,
          format ? "setuptools",
          dist ? "source",
          python ? "py3",
          abi ? "none",
          platform ? "any",
        }:
        mkDrv {
          name =
            if format == "wheel" then
              "${pname}-${version}-${python}-${abi}-${platform}.whl"
            else
              "${pname}-${version}.tar.gz";
          inherit hash dist;
        };
      pythonOlder = v: b.compareVersions "3.13" v < 0;
      pytestCheckHook = simple "pytest-check-hook";
      torch = mkDrv { pname = "torch"; version = torchVersion; };
      triton = simple "triton";
      pytest = simple "pytest";
      hypothesis = simple "hypothesis";
      setuptools = simple "setuptools";
      wheel = simple "wheel";
      pybind11 = simple "pybind11";
      packaging = simple "packaging";
      numpy = simple "numpy";
      transformers = simple "transformers";
      safetensors = simple "safetensors";
      pydantic = simple "pydantic";
      click = simple "click";
      pyyaml = simple "pyyaml";
      tqdm = simple "tqdm";
      gguf = simple "gguf";
      accelerate = simple "accelerate";
      matplotlib = simple "matplotlib";
      pyarrow = simple "pyarrow";
      ninja = simple "ninja";
      nvidia-ml-py = simple "nvidia-ml-py";
      omegaconf = simple "omegaconf";
      pulp = simple "pulp";
      regex = simple "regex";
      rich = simple "rich";
      scipy = simple "scipy";
      datasets = simple "datasets";
      math-verify = simple "math-verify";
    }
    // lib.optionalAttrs (withSglang || withSglangDependencies) (
      b.listToAttrs (
        map (name: {
          inherit name;
          value = buildPythonPackage { pname = name; version = "1.0"; };
        }) [
          "aiohttp" "anthropic" "apache-tvm-ffi" "blobfile" "build" "compressed-tensors"
          "cuda-bindings" "easydict" "einops" "fastapi" "flash-attn-4" "flashinfer"
          "interegular" "ipython" "kernels" "llguidance" "mistral-common" "modelscope" "msgspec"
          "nvidia-cutlass-dsl" "openai" "openai-harmony" "orjson" "outlines" "partial-json-parser"
          "pillow" "prometheus-client" "psutil" "pybase64" "python-multipart" "pyzmq"
          "quack-kernels" "requests" "sentencepiece" "setproctitle" "sgl-deep-gemm"
          "smg-grpc-servicer" "soundfile" "tiktoken" "tilelang" "timm" "tokenspeed-mla"
          "torch-memory-saver" "torchao" "torchaudio" "torchcodec" "torchvision" "uvicorn" "uvloop"
          "watchfiles" "xgrammar"
        ]
      )
    )
    // lib.optionalAttrs withSglang {
      sglang = simple "sglang";
      # pkgs/development/python-modules/sglang-kernel/default.nix (arguments and the attributes
      # the overlay extends: patches, cmakeFlags, preBuild)
      sglang-kernel = callPy (
        {
          lib,
          buildPythonPackage,
          cudaPackages,
          torch,
        }:
        buildPythonPackage {
          pname = "sglang-kernel";
          version = "0.4.3";
          src = mkDrv { name = "source"; };
          sourceRoot = "source/sgl-kernel";
          patches = [ "version-number.patch" "no-repo-fmt.patch" ];
          cmakeFlags = [ (lib.cmakeFeature "CUDA_VERSION" cudaPackages.cudaMajorMinorVersion) ];
          preBuild = "export CMAKE_BUILD_PARALLEL_LEVEL=$NIX_BUILD_CORES\n";
          dependencies = [ torch ];
        }
      ) { };
    }
    // {
      # pkgs/development/python-modules/transformer-engine/default.nix (2.18 argument set)
      transformer-engine = callPy (
        {
          lib,
          buildPythonPackage,
          cudaPackages,
          torch,
          withJax ? true,
          withPytorch ? true,
          withMpi ? false,
        }:
        buildPythonPackage {
          pname = "transformer-engine";
          version = "2.18";
          inherit withJax withPytorch;
          buildInputs = [
            cudaPackages.cuda_nvtx
            cudaPackages.cuda_profiler_api
            cudaPackages.cudnn
          ];
          env = {
            NVTE_CUDA_ARCHS = "120";
            NVTE_FRAMEWORK = if withJax then "jax,pytorch" else "pytorch";
          };
          preBuild = "export NVTE_BUILD_MAX_JOBS=$NIX_BUILD_CORES\n";
        }
      ) { };
    };

  pkgs = lib.fix (b.foldl' (acc: overlay: lib.extends overlay acc) base overlays);
in
pkgs
