# sglang-kernel from upstream's PyPI wheel: the fallback where the pinned nixpkgs has no
# python3Packages.sglang-kernel (it entered nixpkgs through PR #525141; nix/python-overlay.nix
# takes nixpkgs' source build, with our GB10 patch, whenever the pin has one).
#
# 0.4.2.post2 is the version sglang 0.5.12.post1 (nix/packages/sglang-wheel.nix) requires exactly.
# What was read from these two files (downloaded from PyPI, 2026-11-25; nix/README.md):
#   * hashes: sha256 of each file, equal to PyPI's simple-index digest, written as SRI with
#     `nix hash to-sri --type sha256` (aarch64 d1b5351f…2e64, x86_64 f275ce01…2203);
#   * device code (`cuobjdump --list-elf`): sgl_kernel/sm100/common_ops.abi3.so — the ops
#     sgl_kernel/load_utils.py loads on every GPU but compute capability 9.0, GB10 included —
#     holds sm_90, sm_90a, sm_100a, sm_103a, sm_110a, sm_120a and sm_121a cubins in the aarch64
#     wheel: built with CUDA 13 (it links libcudart.so.13), for GB10's own arch. No source build,
#     so blockers 4-5 (cicc memory, gencodes) do not arise;
#   * METADATA `Requires torch == 2.11.0`, and every extension links libtorch*.so / libc10*.so:
#     the C++ ABI of exactly that torch series. With another torch the ops fail to load, so the
#     environment refuses the wheel then (passthru.gb10Fallback.fatal, nix/overlay.nix).
{
  lib,
  stdenv,
  buildPythonPackage,
  fetchPypi,
  autoPatchelfHook,
  cudaPackages,
  numactl,
  python,
  torch,
}:
let
  system = stdenv.hostPlatform.system;
  wheels = {
    aarch64-linux = {
      platform = "manylinux2014_aarch64";
      hash = "sha256-0bU1H2aUlew5tM94gSQoBRBc4uSQmyrn1UJKLUtjLmQ=";
    };
    x86_64-linux = {
      platform = "manylinux2014_x86_64";
      hash = "sha256-8nXOAQEJM8TqZV6DKgVEK3ZquPI9z9b/Z4sV4pXUIgM=";
    };
  };
  wheel = wheels.${system} or (throw "sglang-kernel wheel: no ${system} wheel on PyPI");
  torchSeries = "2.11";
in
buildPythonPackage (finalAttrs: {
  pname = "sglang-kernel";
  version = "0.4.2.post2";
  format = "wheel";

  src = fetchPypi {
    pname = "sglang_kernel";
    inherit (finalAttrs) version;
    # not finalAttrs.format: buildPythonPackage keeps `format` out of the derivation's attributes
    # (mk-python-derivation.nix excludeDrvArgNames), so finalAttrs has none
    format = "wheel";
    inherit (wheel) platform hash;
    dist = "cp310";
    python = "cp310";
    abi = "abi3";
  };

  nativeBuildInputs = [ autoPatchelfHook ];

  buildInputs = [
    cudaPackages.cuda_cudart # libcudart.so.13
    cudaPackages.cuda_nvrtc # libnvrtc.so.13
    cudaPackages.libcublas # libcublas.so.13, libcublasLt.so.13
    numactl # libnuma.so.1
    stdenv.cc.cc.lib # libstdc++, libgcc_s
  ];

  dependencies = [ torch ];

  # The wheel's top level also holds mscclpp's build leftovers, installed straight into
  # site-packages: `_mscclpp.cpython-310-*.so` (a CPython 3.10 module: this Python cannot import
  # it), `lib/` (mscclpp shared and static libraries), `lib64/cmake/dlpack`, `include/mscclpp`.
  # No sgl_kernel extension links them (readelf: their NEEDED lists name libtorch, CUDA, numa and
  # libc only; mscclpp is linked statically into common_ops) and no sgl_kernel module imports
  # _mscclpp, so they go: they would otherwise collide in environments as site-packages/lib.
  # (read in the aarch64 wheel; -f: a wheel without one of them is fine too)
  postInstall = ''
    rm -rf $out/${python.sitePackages}/_mscclpp.cpython-310-*.so \
      $out/${python.sitePackages}/{lib,lib64,include}
  '';

  # libtorch*.so and libc10*.so are torch's own: nixpkgs' torch keeps them in its `lib` output
  # (site-packages/torch/lib is a symlink to it, which autoPatchelf's search does not follow);
  # libcuda.so.1 is the host driver's, found at run time (nix/packages/slime-gb10-env.nix).
  preFixup = ''
    addAutoPatchelfSearchPath ${lib.getLib torch}/lib
  '';
  autoPatchelfIgnoreMissingDeps = [ "libcuda.so.1" ];

  # Importing sgl_kernel loads CUDA ops, which needs a GPU driver: the import is checked by
  # `slime-gb10 verify` (the SGLang step) and the GPU checks, not in the sandbox.
  pythonImportsCheck = [ ];

  # What does not fit this pin (nix/packages/sglang-wheel.nix: `fatal`, `missing`).
  passthru.gb10Fallback = {
    source = "PyPI wheel";
    missing = [ ];
    fatal = lib.optional (lib.versions.majorMinor torch.version != torchSeries) (
      "the sglang-kernel ${finalAttrs.version} wheel is built against torch ${torchSeries} "
      + "(its extensions link libtorch), this nixpkgs has torch ${torch.version}"
    );
  };

  meta = {
    description = "Kernel Library for SGLang (upstream wheel, CUDA 13, sm_121a included on aarch64)";
    homepage = "https://github.com/sgl-project/sglang/tree/main/sgl-kernel";
    license = lib.licenses.asl20;
    sourceProvenance = [ lib.sourceTypes.binaryNativeCode ];
    platforms = lib.attrNames wheels;
  };
})
