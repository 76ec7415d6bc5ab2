"""Fixtures for the platform tests: real executables standing in for tools (a broken ptxas, cuobjdump).

They are shell scripts run as real subprocesses; only their behaviour is fake. The texts they print
are the real tools' formats (ptxas 12.x/13.x error lines, cuobjdump --list-elf / --list-ptx lines).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

PTXAS_VERSION = """ptxas: NVIDIA (R) Ptx optimizing assembler
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:55:12_PM_PDT_2025
Cuda compilation tools, release {release}, V{release}.88
Build cuda_{release}.r{release}/compiler.36424714_0"""

# Writes an ELF magic to the file after -o, like a ptxas that assembled the module.
_ACCEPT = r"""#!/bin/sh
if [ "$1" = "--version" ]; then
cat <<'EOF'
{version}
EOF
exit 0
fi
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; shift; fi
  shift
done
printf '\177ELF\002\001\001' > "$out"
exit 0
"""

_REJECT = r"""#!/bin/sh
if [ "$1" = "--version" ]; then
cat <<'EOF'
{version}
EOF
exit 0
fi
for arg in "$@"; do
  case "$arg" in --gpu-name=*) arch="${{arg#--gpu-name=}}";; esac
done
echo "ptxas fatal   : Value '$arch' is not defined for option 'gpu-name'" >&2
exit 255
"""

SCRIPTS = {
    "accept": _ACCEPT.replace("{version}", PTXAS_VERSION.format(release="13.0")),
    "reject": _REJECT.format(version=PTXAS_VERSION.format(release="12.8")),
    # not `exec sleep`: the sleeping grandchild holds the output pipes, as a real hung tool's worker would
    "hang": "#!/bin/sh\nsleep 100\necho never\n",
    "segfault": "#!/bin/sh\nkill -SEGV $$\n",
    "exit139": "#!/bin/sh\necho 'Segmentation fault (core dumped)' >&2\nexit 139\n",
    "garbage": "#!/bin/sh\necho 'Lorem ipsum 42 %%% not a ptxas'\nexit 0\n",
    # answers --version like ptxas 13.0 but crashes when assembling
    "crash_on_assemble": '#!/bin/sh\nif [ "$1" = "--version" ]; then\ncat <<\'EOF\'\n'
    + PTXAS_VERSION.format(release="13.0")
    + "\nEOF\nexit 0\nfi\nkill -SEGV $$\n",
}


def write_script(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_ptxas(tmp_path: Path, kind: str) -> Path:
    """A file named ``ptxas`` in its own directory (so it can go first on PATH)."""
    return write_script(tmp_path / f"ptxas-{kind}", "ptxas", SCRIPTS[kind])


# cuobjdump's real format (cuda 12/13): "ELF file    1: <stem>.<n>.sm_XY.cubin", "PTX file    1: <stem>.<n>.sm_XY.ptx"
CUOBJDUMP = r"""#!/bin/sh
stem=$(basename "$2" .so)
case "$1" in
  --list-elf)
    echo "ELF file    1: $stem.1.sm_90a.cubin"
    echo "ELF file    2: $stem.2.sm_100a.cubin"
    echo "ELF file    3: $stem.3.sm_120.cubin"
    ;;
  --list-ptx)
    echo "PTX file    1: $stem.1.sm_120.ptx"
    ;;
esac
exit 0
"""


def fake_cuobjdump(tmp_path: Path) -> Path:
    return write_script(tmp_path / "cuobjdump-bin", "cuobjdump", CUOBJDUMP)


def path_with(directory: Path) -> str:
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture
def make_ptxas(tmp_path: Path):
    """``make_ptxas("reject")`` -> path of a fake ptxas of that kind (see SCRIPTS)."""
    return lambda kind: fake_ptxas(tmp_path, kind)


@pytest.fixture
def cuobjdump_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = fake_cuobjdump(tmp_path)
    monkeypatch.setenv("PATH", path_with(path.parent))
    return path


@pytest.fixture
def restore_environ():
    """Fixes write os.environ directly; put it back exactly as it was."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def triton_env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        monkeypatch.delenv(var, raising=False)
