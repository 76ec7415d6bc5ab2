# A revision without sglang (before nixpkgs PR #525141) whose torch is the 2.11 series the
# sglang-kernel wheel was built against. Counterfactual: no stored torch file is 2.11 (the facts
# hold 2.13.0, 2.9.1 and 2.7.1), so this is the one scenario in which the wheel fallback fits.
args:
import ./default.nix (
  args
  // {
    withSglang = false;
    counterfactual."python3Packages.torch".version = "2.11.0";
  }
)
