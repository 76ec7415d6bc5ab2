# megatron-core (NVIDIA Megatron-LM's `megatron.core`), not in nixpkgs: built from its PyPI sdist.
# The hash is the sha256 of megatron_core-0.17.1.tar.gz as downloaded from PyPI (nix/README.md).
# 0.17.x needs Python >= 3.12; its runtime deps are torch, numpy, packaging. Blocker 14
# (`megatron.training` missing from the pip package) does not arise: this sdist's wheel contains
# megatron/training as well, and slime-gb10 only imports `megatron.core`.
{
  lib,
  buildPythonPackage,
  fetchPypi,
  pythonOlder,

  # build-system
  setuptools,
  pybind11,
  packaging,

  # dependencies
  numpy,
  torch,
}:
buildPythonPackage (finalAttrs: {
  pname = "megatron-core";
  version = "0.17.1";
  pyproject = true;

  disabled = pythonOlder "3.12";

  src = fetchPypi {
    pname = "megatron_core";
    inherit (finalAttrs) version;
    hash = "sha256-1MhvO9cC9cyacry4gLHlqn1Y9nVTR0lAVxVFkYdCpMg=";
  };

  # The sdist pins setuptools < 80 for its build; nothing in its setup.py needs that.
  postPatch = ''
    substituteInPlace pyproject.toml \
      --replace-fail '"setuptools<80.0.0"' '"setuptools"'
  '';

  build-system = [
    setuptools
    pybind11 # the optional megatron.core.datasets.helpers_cpp extension
    packaging
  ];

  dependencies = [
    numpy
    packaging
    torch
  ];

  # The test suite is not in the sdist and needs GPUs.
  doCheck = false;

  pythonImportsCheck = [ "megatron.core" ];

  meta = {
    description = "Megatron Core: GPU-optimized building blocks for training transformer models";
    homepage = "https://github.com/NVIDIA/Megatron-LM";
    license = lib.licenses.asl20; # with BSD-3/MIT portions, see LICENSE in the sdist
    platforms = lib.platforms.linux;
  };
})
