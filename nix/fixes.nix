# Build fixes the pinned nixpkgs needs with CUDA 13.2 on aarch64, for packages in our closure
# (sglang's dependencies overlap vLLM's). The list follows graham33/nixos-dgx-spark's
# overlays/fixes.nix (MIT), which its author pruned to what is still needed when moving to this very
# nixpkgs revision (commit 89a4b4c, same day as the flake.lock bump 6b104a0); written anew here.
# Each entry is a no-op when the package is absent, so a nixpkgs bump cannot break evaluation.
{ final, prev }:
let
  inherit (prev) lib;
in
{
  topLevel = lib.optionalAttrs (prev ? opencv4) {
    # OpenCV's CUDA modules do not build against CUDA 13; nothing here needs them.
    opencv4 = prev.opencv4.override { enableCuda = false; };
  };

  python =
    pyFinal: pyPrev:
    lib.optionalAttrs (pyPrev ? compressed-tensors) {
      # Its offload code imports psutil, which the nixpkgs derivation does not propagate.
      compressed-tensors = pyPrev.compressed-tensors.overridePythonAttrs (old: {
        dependencies = (old.dependencies or [ ]) ++ [ pyFinal.psutil ];
      });
    }
    // lib.optionalAttrs (pyPrev ? cupy) {
      # Use the overlay's CUDA set instead of a pinned cuDNN 8 that CUDA 13 does not have.
      cupy = pyPrev.cupy.override { inherit (final) cudaPackages; };
    }
    // lib.optionalAttrs (pyPrev ? bitsandbytes && final.cudaPackages ? cuda_crt) {
      # CUDA 13 moved the crt headers into their own component.
      bitsandbytes = pyPrev.bitsandbytes.overridePythonAttrs (old: {
        buildInputs = (old.buildInputs or [ ]) ++ [ final.cudaPackages.cuda_crt ];
      });
    }
    // lib.optionalAttrs (pyPrev ? jupyter-server) {
      # Two orphaned-kernel tests are flaky under the sandbox's low file-descriptor limit.
      jupyter-server = pyPrev.jupyter-server.overridePythonAttrs (old: {
        disabledTests = (old.disabledTests or [ ]) ++ [
          "test_no_fd_leak_on_disconnect_with_orphaned_kernel_info_channel"
          "test_disconnect_resolves_orphaned_kernel_info_future"
        ];
      });
    };
}
