# math-verify: Hugging Face's math answer checker (what TRL and slime use), the `boxed_math` reward
# of the GSM8K / MATH recipes. Not in nixpkgs (no stored revision has it: tests/nix/nixpkgs-facts.json).
# Its pure-Python wheel from PyPI; hash: sha256 of math_verify-0.9.0-py3-none-any.whl,
# 3703e7c4885354027fa84409d762a596a2906d1fd4deb78361876bd905a76194, equal to PyPI's digest
# (nix/README.md "Pins").
{
  lib,
  buildPythonPackage,
  fetchPypi,

  # dependencies (its wheel's Requires-Dist without extras: latex2sympy2_extended == 1.11.0)
  latex2sympy2-extended,
}:
buildPythonPackage (finalAttrs: {
  pname = "math-verify";
  version = "0.9.0";
  format = "wheel";

  src = fetchPypi {
    pname = "math_verify";
    inherit (finalAttrs) version;
    # not finalAttrs.format: buildPythonPackage keeps `format` out of the derivation's attributes
    # (mk-python-derivation.nix excludeDrvArgNames), so finalAttrs has none
    format = "wheel";
    dist = "py3";
    python = "py3";
    hash = "sha256-NwPnxIhTVAJ/qEQJ12KllqKQbR/U3reDYYdr2QWnYZQ=";
  };

  dependencies = [ latex2sympy2-extended ];

  # parse + verify import the ANTLR parser: this checks the runtime pairing at build time
  pythonImportsCheck = [
    "math_verify"
    "math_verify.parser"
  ];

  meta = {
    description = "Robust mathematical expression evaluation (Hugging Face)";
    homepage = "https://github.com/huggingface/Math-Verify";
    license = lib.licenses.asl20;
    platforms = lib.platforms.all;
  };
})
