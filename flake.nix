{
  description = "slime-gb10: GRPO post-training and NVFP4 on NVIDIA DGX Spark (GB10, sm_121a, CUDA 13)";

  # nixpkgs is pinned by flake.lock to the revision graham33/nixos-dgx-spark's CI builds
  # (efa487181cc01970ebb09ed193fa71dfe94784b1); nix/README.md says where the entry comes from.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs";
    nix-gl-host = {
      url = "github:numtide/nix-gl-host";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  # NVIDIA-authorised prebuilt CUDA redistributables for aarch64-linux and x86_64-linux.
  nixConfig = {
    extra-substituters = [ "https://cache.flox.dev" ];
    extra-trusted-public-keys = [
      "flox-cache-public-1:7F4OyH7ZCnFhcze3fJdfyXYLQw/aV7GEed86nQ7IsOs="
    ];
  };

  outputs =
    {
      self,
      nixpkgs,
      nix-gl-host,
    }:
    let
      inherit (nixpkgs) lib;

      gb10 = import ./nix/gb10.nix;

      systems = [
        "aarch64-linux" # GB10 / DGX Spark: the target
        "x86_64-linux" # Hopper / Blackwell servers
      ];

      # nixpkgs, instantiated once per system: every output (packages, apps, devShells, checks,
      # legacyPackages) takes its packages from here. The flake's own package set carries the GB10
      # toolchain choices (nix/toolchain.nix) below our packages (nix/overlay.nix).
      pkgsBySystem = lib.genAttrs systems (
        system:
        let
          pkgs = import nixpkgs {
            inherit system;
            config = gb10.nixpkgsConfigFor {
              inherit system;
              inherit (lib) getName;
              # nixpkgs' license-based CUDA predicate where this revision has it (evaluated only
              # when a package's licence is checked, so referring to `pkgs` here is not a cycle).
              cudaPredicate = pkgs._cuda.lib.allowUnfreeCudaPredicate or null;
            };
            overlays = [
              self.overlays.gb10-toolchain
              self.overlays.default
            ];
          };
        in
        pkgs
      );

      forAllSystems = f: lib.mapAttrs (_: f) pkgsBySystem;
    in
    {
      lib = {
        inherit gb10;
      };

      overlays = {
        # Our packages (slime-gb10, megatron-core, math-verify, the environments ...) on a
        # consumer's nixpkgs, with the consumer's CUDA set and capabilities left as they are.
        # `./.` (a path: lib.fileset needs one) is this flake's source, the git-tracked files.
        default = import ./nix/overlay.nix {
          inherit gb10 nix-gl-host;
          src = ./.;
        };
        # The GB10 / server toolchain choices this flake builds with (CUDA 13.2 for everything,
        # the aarch64 SBSA fix, CUDA 13 build fixes, sgl-kernel and TransformerEngine for the
        # machine's archs): opt-in, never part of `default` (a Jetson's CUDA set is not a GB10's).
        gb10-toolchain = import ./nix/toolchain.nix { inherit gb10; };
      };

      # The flake's own package set per system (`nix build .#legacyPackages.<system>.<attr>`).
      legacyPackages = pkgsBySystem;

      packages = forAllSystems (
        pkgs:
        let
          py = pkgs.slime-gb10-python.pkgs;
        in
        {
          # the full environment where the pin has sglang, else the core one (nix/overlay.nix)
          default = pkgs.slime-gb10-env;
          slime-gb10 = pkgs.slime-gb10-env;
          slime-gb10-core = pkgs.slime-gb10-core;
          python = pkgs.slime-gb10-env.python;
          transformer-engine = py.transformer-engine;
          megatron-core = py.megatron-core;
          cuda-profiler-api-shim = pkgs.cuda-profiler-api-shim;
          # The GPU checks (doctor, pytest -m gpu): not in `checks`, so `nix flake check` passes on
          # any machine; `nix build .#gpu-checks -L` runs them on a GPU runner (nix/README.md).
          gpu-checks = pkgs.callPackage ./nix/gpu-checks.nix { src = ./.; };
        }
        // lib.optionalAttrs pkgs.slime-gb10-has-sglang {
          sglang-kernel = py.sglang-kernel;
        }
        # the full environment by name, also where it is not the default (SGLang's dependencies
        # partly missing at the pin: built without them, with a warning); absent where it cannot work
        // lib.optionalAttrs (pkgs.slime-gb10-sglang.fatal == [ ]) {
          slime-gb10-full = pkgs.slime-gb10-full;
        }
      );

      apps = forAllSystems (
        pkgs:
        let
          app = {
            type = "app";
            program = lib.getExe pkgs.slime-gb10-env;
            meta.description = "slime-gb10 CLI (GRPO + NVFP4 on GB10), CUDA 13 environment";
          };
        in
        {
          default = app;
          slime-gb10 = app;
          # The one command a GB10 owner runs once: every GB10-only claim checked, one Markdown
          # report (slime-gb10-verify.md) to paste into an issue; exit 1 on any failure.
          verify = {
            type = "app";
            program = "${pkgs.writeShellScript "slime-gb10-verify" ''
              exec ${lib.getExe pkgs.slime-gb10-env} verify --repo ${self} "$@"
            ''}";
            meta.description = "slime-gb10 verify: doctor, sm_121a compiles, GPU tests, GRPO steps, benchmarks -> one report";
          };
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.callPackage ./nix/devshell.nix { };
      });

      # CPU checks only: they build in the normal sandbox on any machine (the GPU ones are
      # packages.<system>.gpu-checks). callPackage makes its result overridable; `checks` must
      # hold derivations only.
      checks = forAllSystems (
        pkgs:
        builtins.removeAttrs (pkgs.callPackage ./nix/checks.nix { src = ./.; }) [
          "override"
          "overrideDerivation"
        ]
      );
    };
}
