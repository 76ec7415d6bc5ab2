# latex2sympy2-extended: LaTeX -> SymPy, the parser under Hugging Face's math-verify (the
# `boxed_math` reward). Not in nixpkgs (no stored revision has it: tests/nix/nixpkgs-facts.json).
# Its pure-Python wheel from PyPI; hash: sha256 of latex2sympy2_extended-1.11.0-py3-none-any.whl,
# aebb77d52ce269e25028e4bea89ddb14d242ba36bcf7b636496fb5fd9728d234, equal to PyPI's digest
# (nix/README.md "Pins"). math-verify 0.9.0 requires exactly this version.
{
  lib,
  buildPythonPackage,
  fetchPypi,
  python,

  # dependencies (its wheel's Requires-Dist: sympy, antlr4-python3-runtime >= 4.9.3, <= 4.13.2)
  sympy,
  antlr4-python3-runtime,
}:
buildPythonPackage (finalAttrs: {
  pname = "latex2sympy2-extended";
  version = "1.11.0";
  format = "wheel";

  src = fetchPypi {
    pname = "latex2sympy2_extended";
    inherit (finalAttrs) version;
    # not finalAttrs.format: buildPythonPackage keeps `format` out of the derivation's attributes
    # (mk-python-derivation.nix excludeDrvArgNames), so finalAttrs has none
    format = "wheel";
    dist = "py3";
    python = "py3";
    hash = "sha256-rrt31SziaeJQKOS+qJ3bFNJCuja897Y2SW+1/Zco0jQ=";
  };

  # nixpkgs' antlr4-python3-runtime (the one omegaconf also propagates: one `antlr4` module in an
  # environment, blocker 13) follows nixpkgs' antlr4, a 4.13.x. The wheel ships parsers generated
  # by ANTLR 4.9.3, 4.11.0 and 4.13.2 and picks one by the runtime's exact version string
  # (antlr_parser.py: startswith("4.13.2")); a 4.13.2 parser runs on any 4.13 runtime (same ATN
  # serialization), so the whole 4.13 series selects it.
  postInstall = ''
    substituteInPlace $out/${python.sitePackages}/latex2sympy2_extended/antlr_parser.py \
      --replace-fail 'antlr_version.startswith("4.13.2")' 'antlr_version.startswith("4.13")'
  '';

  dependencies = [
    sympy
    antlr4-python3-runtime
  ];
  # The runtime's version is nixpkgs' 4.13.x: the METADATA bound (<= 4.13.2) is relaxed so that
  # tools reading it do not object; nothing checks a wheel's bounds at build time, the import does.
  pythonRelaxDeps = [ "antlr4-python3-runtime" ];

  pythonImportsCheck = [ "latex2sympy2_extended.latex2sympy2" ];

  meta = {
    description = "Convert LaTeX math to SymPy expressions (Hugging Face's extended latex2sympy2)";
    homepage = "https://github.com/huggingface/latex2sympy2_extended";
    license = lib.licenses.mit;
    platforms = lib.platforms.all;
  };
})
