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

      pkgsWith =
        { cached }:
        system:
        let
          pkgs = import nixpkgs {
            inherit system;
            config = gb10.nixpkgsConfigFor {
              inherit system cached;
              inherit (lib) getName;
              # nixpkgs' license-based CUDA predicate where this revision has it (evaluated only
              # when a package's licence is checked, so referring to `pkgs` here is not a cycle).
              cudaPredicate = pkgs._cuda.lib.allowUnfreeCudaPredicate or null;
            };
            overlays = [ self.overlays.default ];
          };
        in
        pkgs;
      pkgsFor = pkgsWith { cached = false; };
      # capability 12.0 for all but sgl-kernel and TE (nix/gb10.nix cachedCudaCapabilities)
      pkgsCachedFor = pkgsWith { cached = true; };

      forAllSystems = f: lib.genAttrs systems (system: f (pkgsFor system));
    in
    {
      lib = {
        inherit gb10;
      };

      # `./.` (a path: lib.fileset needs one) is this flake's source, the git-tracked files.
      overlays.default = import ./nix/overlay.nix {
        inherit gb10 nix-gl-host;
        src = ./.;
      };

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
          # a faster first build where a public cache has the capability-12.0 derivations
          slime-gb10-cached = (pkgsCachedFor pkgs.stdenv.hostPlatform.system).slime-gb10-env;
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
