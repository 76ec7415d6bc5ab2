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

      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config = gb10.nixpkgsConfigFor {
            inherit system;
            inherit (lib) getName;
          };
          overlays = [ self.overlays.default ];
        };

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

      packages = forAllSystems (pkgs: {
        default = pkgs.slime-gb10-env;
        slime-gb10 = pkgs.slime-gb10-env;
        python = pkgs.slime-gb10-env.python;
        sglang-kernel = pkgs.python3Packages.sglang-kernel;
        transformer-engine = pkgs.python3Packages.transformer-engine;
        megatron-core = pkgs.python3Packages.megatron-core;
        cuda-profiler-api-shim = pkgs.cuda-profiler-api-shim;
      });

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
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.callPackage ./nix/devshell.nix { };
      });

      # callPackage makes its result overridable; `checks` must hold derivations only.
      checks = forAllSystems (
        pkgs:
        builtins.removeAttrs (pkgs.callPackage ./nix/checks.nix { src = ./.; }) [
          "override"
          "overrideDerivation"
        ]
      );
    };
}
