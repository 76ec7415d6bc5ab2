# nvidia-modelopt: NVIDIA's Model Optimizer, the tool that writes the NVFP4 checkpoints SGLang loads.
# Not in nixpkgs. A test dependency only: tests/nvfp4/test_modelopt_parity.py compares our NVFP4
# bytes and our Hugging Face export with its own (plain PyTorch, runs on a CPU).
# Installed from its pure-Python wheel, like `.ci/run`'s `pip install -e '.[test]'`.
# Hash: sha256 of nvidia_modelopt-0.47.0-py3-none-any.whl, equal to PyPI's simple-index
# db13e62d7efe4a1512e8b8c3f479e28d64022306f94a194f13234e7dca1d3120 (nix/README.md).
{
  lib,
  buildPythonPackage,
  fetchPypi,

  # dependencies (its wheel's Requires-Dist without extras)
  ninja,
  numpy,
  nvidia-ml-py,
  omegaconf,
  packaging,
  pulp,
  pydantic,
  pyyaml,
  regex,
  rich,
  safetensors,
  scipy,
  setuptools,
  torch,
  tqdm,
}:
buildPythonPackage (finalAttrs: {
  pname = "nvidia-modelopt";
  version = "0.47.0";
  format = "wheel";

  src = fetchPypi {
    pname = "nvidia_modelopt";
    inherit (finalAttrs) version;
    # not finalAttrs.format: buildPythonPackage keeps `format` out of the derivation's attributes
    # (mk-python-derivation.nix excludeDrvArgNames), so finalAttrs has none
    format = "wheel";
    dist = "py3";
    python = "py3";
    hash = "sha256-2xPmLX7+ShUS6LjD9HnijWQCIwb5ShlPEyNOfcodMSA=";
  };

  dependencies = [
    ninja
    numpy
    nvidia-ml-py
    omegaconf
    packaging
    pulp
    pydantic
    pyyaml
    regex
    rich
    safetensors
    scipy
    setuptools
    torch
    tqdm
  ];

  # It asks for setuptools >= 80 but never imports it (no `setuptools` in its sources);
  # nixpkgs' setuptools may be older.
  pythonRelaxDeps = [ "setuptools" ];

  # Its test suite is not in the wheel; the NVFP4 path we use is checked by our parity tests.
  pythonImportsCheck = [ "modelopt.torch.quantization.qtensor" ];

  meta = {
    description = "NVIDIA Model Optimizer: quantization (NVFP4, FP8) and Hugging Face checkpoint export";
    homepage = "https://github.com/NVIDIA/Model-Optimizer";
    license = lib.licenses.asl20;
    platforms = lib.platforms.all;
  };
})
