"""The package's structure: no import cycle (lazy imports inside functions count too), no file over
600 lines (the few still over it named, each with the most it may have), no markdown inside the
package, no CUDA C in Python strings."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "slime_gb10"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PACKAGE.rglob("*.py"):
        name = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its body (packages' __init__ left out:
    importing a submodule imports its package, which is not a dependency of the submodule's code)."""
    mods = _modules()
    packages = {m for m, f in mods.items() if f.name == "__init__.py"}
    graph = {}
    for name, path in mods.items():
        if name in packages:
            continue
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slime_gb10"):
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    deps.add(candidate if candidate in mods else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("slime_gb10"))
        graph[name] = {d for d in deps if d in mods and d not in packages and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*stack, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


# The layers, lowest first: a module may import its own layer and those below, never one above
# (issue #38: the doctor sits above what it checks). The top level (cli, doctor, bench) is above all.
LAYERS = ["slime_gb10.utils", "slime_gb10.platform", "slime_gb10.nvfp4", "slime_gb10.grpo"]


def _layer(module: str) -> int:
    for number, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return number
    return len(LAYERS)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    assert (
        _layer("slime_gb10.platform.checks") < _layer("slime_gb10.grpo.trainer") < _layer("slime_gb10.doctor")
    )
    upward = sorted(
        f"{module} -> {dep}"
        for module, deps in import_graph().items()
        for dep in deps
        if _layer(dep) > _layer(module)
    )
    assert not upward, upward


def test_no_markdown_and_no_cuda_strings_in_the_package():
    assert not list(PACKAGE.rglob("*.md"))
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "__global__" not in text and "asm volatile(" not in text, (
            f"CUDA C in {path}: move it to a .cu file"
        )


def test_nvfp4_exports_everything_it_lists_and_the_doctor_loads_no_torch():
    import subprocess
    import sys

    import slime_gb10.nvfp4 as nvfp4

    assert sorted(nvfp4.__all__) == sorted(nvfp4._EXPORTS)
    for name in nvfp4.__all__:
        assert getattr(nvfp4, name) is not None
    code = "import sys, slime_gb10.doctor as d; d.registered_checks(); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"  # the doctor probes torch in children only


# The cap a newcomer can read a file under (issue #38); no package file is over it.
LINE_CAP = 600
TRAINER_CAP = 350  # GRPOTrainer: the loop, setup and saving; the rest lives beside what it does


def test_no_package_file_over_the_line_cap():
    sizes = {
        str(f.relative_to(PACKAGE)): len(f.read_text(encoding="utf-8").splitlines())
        for f in PACKAGE.rglob("*.py")
    }
    over = {name: n for name, n in sizes.items() if n > LINE_CAP}
    assert not over, f"files over the {LINE_CAP}-line cap: {over}"


def test_the_trainer_class_is_thin():
    import ast

    tree = ast.parse((PACKAGE / "grpo" / "trainer.py").read_text(encoding="utf-8"))
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GRPOTrainer"]
    assert cls.end_lineno - cls.lineno + 1 <= TRAINER_CAP


def test_the_core_runs_without_the_hopper_only_kernel():
    """``nvfp4/hopper/`` (the sm_90 wgmma kernel) is optional: with it absent, the trainer and the
    NVFP4 module import, and an NVFP4Linear quantizes a layer and runs it on the CPU."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["slime_gb10.nvfp4.hopper"] = None  # absent: importing it raises ImportError
import torch
import slime_gb10.grpo.trainer, slime_gb10.grpo.cli, slime_gb10.doctor
from slime_gb10.nvfp4 import NVFP4Linear, w4a16
linear = torch.nn.Linear(64, 32)
layer = NVFP4Linear.from_linear(linear, backend="reference")
x = torch.randn(3, 64)
err = (layer(x) - linear(x)).abs().max().item() / linear(x).abs().max().item()
print(w4a16._cuda_wgmma is None, w4a16.wgmma_is_faster(64, 4096, 4096), err < 0.3)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False", "True"]
