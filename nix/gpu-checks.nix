# packages.<system>.gpu-checks: the checks only a GPU can run, as one buildable output.
#
#   doctor   `slime-gb10 doctor` exits 0 (no `fail` line)
#   pytest   pytest -m gpu tests/platform tests/nvfp4 tests/grpo (Triton JIT on the device, NVFP4Linear's
#            TE path against the reference, an sgl-kernel op, SGLang start/logprobs/weight update,
#            Megatron with the TE spec, one GRPO step on a tiny model)
#
# Each needs the `cuda` system feature (requiredSystemFeatures, as nixpkgs' passthru.gpuCheck
# derivations): a runner with nix-required-mounts' nvidia-gpu preset, or the sandbox paths in
# nix/README.md ("GPU runner"). They are not flake `checks`, because `nix flake check` would then
# fail on every machine without that feature; `nix build .#gpu-checks -L` runs both.
{
  linkFarm,
  runCommand,
  slime-gb10-env,
  src,
}:
let
  gpuCheck =
    name: script:
    runCommand "slime-gb10-gpu-${name}"
      {
        nativeBuildInputs = [ slime-gb10-env ];
        requiredSystemFeatures = [ "cuda" ];
      }
      ''
        ${import ./check-prologue.nix src}
        ${script}
        touch $out
      '';
in
linkFarm "slime-gb10-gpu-checks" {
  doctor = gpuCheck "doctor" "slime-gb10 doctor";
  pytest = gpuCheck "pytest" "python -m pytest -q -m gpu -p no:cacheprovider tests/platform tests/nvfp4 tests/grpo";
}
