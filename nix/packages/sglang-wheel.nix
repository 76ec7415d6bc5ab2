# sglang from upstream's PyPI wheel: the fallback where the pinned nixpkgs has no
# python3Packages.sglang (it entered nixpkgs through PR #525141; nix/python-overlay.nix keeps
# nixpkgs' package whenever the pin has one).
#
# 0.5.12.post1 is the version nixpkgs packages (pkgs/development/python-modules/sglang/default.nix
# @ 3983fac). Its wheels carry one compiled module (sglang/srt/grpc/_core, Rust; it needs only
# libc, libm and libgcc_s), so there is one wheel per CPython: cp313, the interpreter nix/gb10.nix
# pins. Hashes: sha256 of each file downloaded from PyPI (2026-11-25), equal to PyPI's
# simple-index digest (aarch64 c0bf0723…48d7, x86_64 f54da8fc…e794), as SRI with
# `nix hash to-sri --type sha256`.
#
# The dependencies are nixpkgs' own list for this version (the same file @ 3983fac: it maps the
# wheel's Requires-Dist to attribute names and drops cuda-python for cuda-bindings and py-spy).
# A pin without sglang may lack some of them too; those are left out, named in
# passthru.gb10Fallback.missing, and the environment then stays the core one unless asked for
# the full one by name (nix/overlay.nix).
{
  lib,
  stdenv,
  buildPythonPackage,
  fetchPypi,
  autoPatchelfHook,
  python,
  # the Python package set this package belongs to (its dependencies are looked up by name)
  pythonPackages,
}:
let
  system = stdenv.hostPlatform.system;
  wheels = {
    aarch64-linux = {
      platform = "manylinux_2_34_aarch64";
      hash = "sha256-wL8HI4Qv7/+Y9/skNkCdU8GRhUMkLsKNKysdMCEsSNc=";
    };
    x86_64-linux = {
      platform = "manylinux_2_34_x86_64";
      hash = "sha256-9U2o/Lw421LY3TUlW50J+NPH7b66tRC38noZ7leH55Q=";
    };
  };
  wheel = wheels.${system} or (throw "sglang wheel: no ${system} wheel on PyPI");
  pythonTag = "cp313";

  # nixpkgs' `dependencies` for sglang 0.5.12.post1 (@ 3983fac), in its order, less torchcodec
  # (below). nixpkgs maps the wheel's flashinfer_python + flashinfer_cubin to its `flashinfer`
  # (built from source with its kernels; there is no flashinfer-cubin package) and drops py-spy.
  dependencyNames = [
    "aiohttp"
    "anthropic"
    "apache-tvm-ffi"
    "blobfile"
    "build"
    "compressed-tensors"
    "cuda-bindings"
    "datasets"
    "easydict"
    "einops"
    "fastapi"
    "flash-attn-4"
    "flashinfer"
    "gguf"
    "interegular"
    "ipython"
    "kernels"
    "llguidance"
    "mistral-common"
    "modelscope"
    "msgspec"
    "ninja"
    "numpy"
    "nvidia-cutlass-dsl"
    "nvidia-ml-py"
    "openai"
    "openai-harmony"
    "orjson"
    "outlines"
    "packaging"
    "partial-json-parser"
    "pillow"
    "prometheus-client"
    "psutil"
    "pybase64"
    "pydantic"
    "python-multipart"
    "pyzmq"
    "quack-kernels"
    "requests"
    "scipy"
    "sentencepiece"
    "setproctitle"
    "sglang-kernel"
    "sgl-deep-gemm"
    "smg-grpc-servicer"
    "soundfile"
    "tiktoken"
    "tilelang"
    "timm"
    "tokenspeed-mla"
    "torch"
    "torch-memory-saver"
    "torchao"
    "torchaudio"
    "torchvision"
    "tqdm"
    "transformers"
    "uvicorn"
    "uvloop"
    "watchfiles"
    "xgrammar"
  ];
  # The wheel's METADATA (read from both files) chooses by machine: torchcodec everywhere but
  # aarch64; av and decord2 on aarch64 (`platform_machine == "aarch64"` markers).
  platformDependencyNames = {
    aarch64-linux = [ "av" ];
    x86_64-linux = [ "torchcodec" ];
  }.${system} or [ ];
  # decord2 decodes video for multimodal requests, which the GRPO engine never sends, and no
  # nixpkgs revision stored has it (tests/nix/nixpkgs-facts.json): taken where the set has it,
  # never counted as missing.
  optionalNames = lib.optionals (system == "aarch64-linux") [ "decord2" ];
  requiredNames = dependencyNames ++ platformDependencyNames;
  missing = lib.filter (name: !(pythonPackages ? ${name})) requiredNames;
  interpreterTag = "cp${lib.replaceStrings [ "." ] [ "" ] python.pythonVersion}";
in
buildPythonPackage (finalAttrs: {
  pname = "sglang";
  version = "0.5.12.post1";
  format = "wheel";

  src = fetchPypi {
    inherit (finalAttrs) pname version;
    # not finalAttrs.format: buildPythonPackage keeps `format` out of the derivation's attributes
    # (mk-python-derivation.nix excludeDrvArgNames), so finalAttrs has none
    format = "wheel";
    inherit (wheel) platform hash;
    dist = pythonTag;
    python = pythonTag;
    abi = pythonTag;
  };

  nativeBuildInputs = [ autoPatchelfHook ];
  buildInputs = [ stdenv.cc.cc.lib ]; # libgcc_s for the Rust module

  dependencies = map (name: pythonPackages.${name}) (
    lib.subtractLists missing requiredNames ++ lib.filter (name: pythonPackages ? ${name}) optionalNames
  );

  # The wheel pins exact versions (torch==2.11.0, transformers==5.6.0, sglang-kernel==0.4.2.post2,
  # ...); nixpkgs' own package relaxes thirteen of them. What runs together is checked on the
  # device by `slime-gb10 verify` (SGLang start, logprobs, weight update), not by a name match.
  dontCheckRuntimeDeps = true;
  # Importing sglang initialises CUDA-facing modules; checked on the device (see above).
  pythonImportsCheck = [ ];

  # What does not fit this pin: `fatal` (the package cannot work: the full environment refuses
  # it), `missing` (dependencies left out: the default environment stays the core one).
  passthru.gb10Fallback = {
    source = "PyPI wheel";
    inherit missing;
    fatal = lib.optional (interpreterTag != pythonTag) (
      "the sglang ${finalAttrs.version} fallback is the ${pythonTag} wheel; this Python is ${python.pythonVersion}"
    );
  };

  meta = {
    description = "High-performance serving framework for large language models (upstream wheel)";
    homepage = "https://www.sglang.io/";
    license = lib.licenses.asl20;
    sourceProvenance = [
      lib.sourceTypes.fromSource
      lib.sourceTypes.binaryNativeCode
    ];
    mainProgram = "sglang";
    platforms = lib.attrNames wheels;
  };
})
