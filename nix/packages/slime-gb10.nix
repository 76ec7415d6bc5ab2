# slime-gb10 itself, built from this repository's pyproject.toml + python/.
# Name, version and the dependency list come from pyproject.toml (builtins.fromTOML), so the flake
# and the Python metadata cannot drift; tests/nix/test_versions.py checks the mapping below.
{
  lib,
  buildPythonPackage,
  src,

  # build-system
  setuptools,
  wheel,

  # dependencies (pyproject.toml [project].dependencies)
  torch,
  numpy,
  transformers,
  safetensors,
  pydantic,
  click,
  pyyaml,
  tqdm,

  # optional-dependencies (sglang: absent from nixpkgs revisions before PR #525141)
  sglang ? null,
  megatron-core,
  transformer-engine,
  triton,
  gguf,
  accelerate,
  matplotlib,
  pyarrow,
  datasets,
  # HF math-verify (the boxed_math reward): not in nixpkgs, packaged by nix/python-overlay.nix
  math-verify,

  # tests
  pytestCheckHook,
  hypothesis,
}:
let
  project = (builtins.fromTOML (builtins.readFile (src + "/pyproject.toml"))).project;
in
buildPythonPackage {
  pname = project.name;
  inherit (project) version;
  pyproject = true;

  # Only what the wheel is built from: no tests, nix/, caches or results in the store path.
  src = lib.fileset.toSource {
    root = src;
    fileset = lib.fileset.unions [
      (src + "/pyproject.toml")
      (src + "/README.md")
      (lib.fileset.fileFilter (
        file:
        file.hasExt "py"
        || file.hasExt "json"
        || file.hasExt "yaml"
        || file.hasExt "cu" # kernel and compile-check sources shipped as package data
        || file.hasExt "cuh"
        || file.name == "py.typed"
      ) (src + "/python"))
    ];
  };

  build-system = [
    setuptools
    wheel
  ];

  dependencies = [
    torch
    numpy
    transformers
    safetensors
    pydantic
    click
    pyyaml
    tqdm
  ];

  optional-dependencies = {
    sglang = lib.optional (sglang != null) sglang;
    megatron = [ megatron-core ];
    te = [ transformer-engine ];
    triton = [ triton ];
    gguf = [
      gguf
      accelerate
    ];
    plot = [ matplotlib ];
    data = [ pyarrow ];
    gsm8k = [
      datasets
      math-verify
    ];
  };

  # The test suite runs as flake checks (nix/checks.nix) with the whole repository as source.
  doCheck = false;
  nativeCheckInputs = [
    pytestCheckHook
    hypothesis
  ];

  pythonImportsCheck = [
    "slime_gb10"
    "slime_gb10.cli"
  ];

  meta = {
    description = project.description;
    homepage = project.urls.Homepage;
    license = lib.licenses.asl20;
    mainProgram = "slime-gb10";
    platforms = lib.platforms.linux;
  };
}
