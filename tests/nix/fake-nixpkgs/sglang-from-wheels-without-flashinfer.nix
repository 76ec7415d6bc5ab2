# sglang-from-wheels without two of sglang's dependencies, flashinfer and xgrammar, to exercise the
# fallback's `missing` path. Counterfactual: every stored nixpkgs that lacks sglang has both.
args:
import ./sglang-from-wheels.nix (
  args
  // {
    withoutPython = [
      "flashinfer"
      "xgrammar"
    ];
  }
)
