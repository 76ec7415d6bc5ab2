# A fake nixpkgs for evaluating this flake where nixpkgs cannot be fetched (tests/nix).
#
# It cannot claim more than nixpkgs has: every attribute it provides is a record of
# tests/nix/nixpkgs-facts.json (the nixpkgs file, the stored commit read, version, licence,
# platforms), and tests/nix/test_facts.py checks both directions. Packages are plain attribute
# sets that remember their arguments (tests inspect what the overlays did) and compute
# `meta.available` as pkgs/stdenv/generic/check-meta.nix does from those facts: not broken, the
# system in meta.platforms and not in meta.badPlatforms, every licence free or accepted by
# config.allowUnfreePredicate (called with the derivation's attributes).
#
# Interfaces mimicked: `import nixpkgs { system; config; overlays; }`, callPackage,
# pythonPackagesExtensions, overridePythonAttrs, `.override` with the argument set the facts
# record, cudaPackages_13_2 components with the outputs the facts record, _cuda.extend,
# python3x.withPackages, runCommand / symlinkJoin / mkShell / writeShellScript(Bin) / linkFarm.
{
  system,
  config ? { },
  overlays ? [ ],
  # false: a nixpkgs revision from before PR #525141 (no python3Packages.sglang / sglang-kernel;
  # the stored files exist only at commits after it)
  withSglang ? true,
  # false: a revision whose _cuda has no lib.allowUnfreeCudaPredicate (before the _cuda lib)
  withCudaPredicate ? true,
  # { "<attribute>" = i; }: take that attribute's facts from its variants[i] (another stored
  # version), for the tests that run the flake against every variant
  pick ? { },
  # Scenarios no stored nixpkgs file shows, each named by the test that uses it
  # (tests/nix/fake-nixpkgs/*.nix): { "<attribute>" = { version = ...; }; }
  counterfactual ? { },
  # Python attributes to leave out, also counterfactual (every stored revision has them)
  withoutPython ? [ ],
}:
let
  libPath = builtins.getEnv "SLIME_GB10_NIXPKGS_LIB";
  lib = if libPath == "" then import ../stub-lib.nix else import libPath;
  b = builtins;

  facts = (b.fromJSON (b.readFile ../nixpkgs-facts.json)).attributes;
  fact =
    name:
    let
      e = facts.${name} or (throw "fake nixpkgs: no fact for ${name} (tests/nix/nixpkgs-facts.json)");
      chosen = if pick ? ${name} then e // b.elemAt e.variants pick.${name} else e;
    in
    chosen // (counterfactual.${name} or { });

  platformGroups = {
    linux = lib.platforms.linux;
    unix = lib.platforms.linux ++ [ "aarch64-darwin" "x86_64-darwin" ];
    all = lib.platforms.all;
  };
  platformsOf = p: if p == null then null else if b.isString p then platformGroups.${p} else p;
  licenceOf = name: lib.licenses.${name} or (throw "fake nixpkgs: licence ${name} is not in stub-lib");

  # meta from a fact record
  metaFrom =
    f:
    {
      license = map licenceOf f.license;
    }
    // lib.optionalAttrs (f.platforms != null) { platforms = platformsOf f.platforms; }
    // lib.optionalAttrs (f.badPlatforms != null) { badPlatforms = platformsOf f.badPlatforms; };

  # pkgs/stdenv/generic/check-meta.nix `available` (checkMetaRecursively off)
  availableFor =
    attrs:
    let
      meta = attrs.meta or { };
      licences = lib.toList (meta.license or [ ]);
      unfree = b.any (l: !(l.free or true)) licences;
      predicate = config.allowUnfreePredicate or (_: false);
    in
    !(meta.broken or false)
    && (!(meta ? platforms) || b.elem system meta.platforms)
    && !(b.elem system (meta.badPlatforms or [ ]))
    && (!unfree || (config.allowUnfree or false) || predicate attrs);

  mkDrv =
    attrs:
    let
      name = attrs.name or "${attrs.pname}-${attrs.version or "0"}";
      outputs = attrs.outputs or [ "out" ];
      # mkDerivation: passthru attributes are attributes of the result, and `passthru` too.
      self =
        attrs
        // (attrs.passthru or { })
        // {
          type = "derivation";
          inherit name outputs;
          meta = (attrs.meta or { }) // {
            available = availableFor attrs;
          };
          # make-derivation.nix: outPath and drvPath assert check-meta's validity, so reading them
          # (a comparison of two derivations does) throws for a package that is not available
          outPath =
            if availableFor attrs then
              "/nix/store/00000000000000000000000000000000-${name}"
            else
              throw "fake nixpkgs: ${name} is not available on ${system} (check-meta refuses it)";
          drvPath =
            if availableFor attrs then
              "/nix/store/00000000000000000000000000000000-${name}.drv"
            else
              throw "fake nixpkgs: ${name} is not available on ${system} (check-meta refuses it)";
          overrideAttrs = f: mkDrv (attrs // (if b.isFunction f then f attrs else f));
        }
        // b.listToAttrs (
          map (o: {
            name = o;
            value = self // {
              # as in nixpkgs: `out` is the derivation's own path, other outputs get a suffix
              outPath = "/nix/store/00000000000000000000000000000000-${name}${lib.optionalString (o != "out") "-${o}"}";
              outputName = o;
              outputSpecified = true;
            };
          }) outputs
        );
    in
    self;

  # buildPythonPackage: accepts attrs or (finalAttrs: attrs), like nixpkgs; dependencies are
  # propagated (pkgs/development/interpreters/python/mk-python-derivation.nix).
  buildPythonPackage =
    attrsOrFn:
    let
      # finalAttrs is the derivation's attributes: mk-python-derivation.nix keeps `format` and
      # `pyproject` out of them (excludeDrvArgNames), so `finalAttrs.format` is an error there too
      attrs =
        if b.isFunction attrsOrFn then
          lib.fix (final: attrsOrFn (b.removeAttrs final [ "format" "pyproject" ]))
        else
          attrsOrFn;
      drv = mkDrv (
        attrs
        // {
          propagatedBuildInputs = (attrs.propagatedBuildInputs or [ ]) ++ (attrs.dependencies or [ ]);
        }
      );
    in
    drv
    // {
      overridePythonAttrs = f: buildPythonPackage (attrs // (if b.isFunction f then f attrs else f));
    };

  # Every attribute a package function asks for, from `scope`; explicit args win.
  callPackageWith =
    scope: fn: args:
    let
      f = if b.isFunction fn || fn ? __functor then fn else import fn;
      auto = b.intersectAttrs (lib.functionArgs f) scope;
    in
    lib.makeOverridable f (auto // args);

  # A package function whose argument set is the one the facts record ("name" or "name ? default")
  withFactArgs =
    f: body:
    let
      parse =
        a:
        let
          m = b.match "([^ ]+)( \\?.*)?" a;
        in
        {
          name = b.head m;
          value = b.elemAt m 1 != null;
        };
    in
    lib.setFunctionArgs body (b.listToAttrs (map parse f.args));

  mkExtensible =
    attrs:
    attrs
    // {
      extend = f: mkExtensible (attrs // f (mkExtensible attrs) attrs);
    };

  cudaComponent =
    pname:
    let
      f = fact "cudaPackages_13_2.${pname}";
    in
    mkDrv {
      inherit pname;
      version = "13.2";
      outputs = f.outputs;
      meta = metaFrom f;
    };

  cudaPackages_13_2 = lib.genAttrs [
    "cuda_nvcc"
    "cuda_cudart"
    "cuda_cccl"
    "cuda_crt"
    "cuda_nvrtc"
    "cuda_nvtx"
    "cuda_profiler_api"
    "cuda_cuobjdump"
    "cuda_nvdisasm"
    "cuda_compat"
    "cudnn"
    "libcublas"
    "libcurand"
  ] cudaComponent
  // {
    cudaMajorMinorVersion = "13.2";
    # the stdenv whose gcc nvcc 13.2 supports (cuda-modules/packages/backendStdenv.nix)
    backendStdenv = {
      name = "cuda-backend-stdenv";
      cc = mkDrv {
        pname = "gcc-wrapper";
        version = "14";
      };
    };
  };

  # _cuda/lib/cuda.nix @ 1991f56: every licence free, or one of NVIDIA's CUDA licences (by shortName)
  cudaLib = lib.optionalAttrs withCudaPredicate {
    allowUnfreeCudaPredicate =
      package:
      b.all (
        l:
        (l.free or false)
        || b.elem (l.shortName or null) [
          "CUDA EULA"
          "cuDNN EULA"
        ]
      ) (lib.toList package.meta.license);
  };

  # python3 is the revision's default interpreter (3.14 at the newest all-packages.nix read);
  # python313 the one the flake pins. Both share one package set here (what differs is the
  # interpreter's name).
  mkPythonFor = final: attr: {
    version = (fact attr).version;
    pythonVersion = lib.versions.majorMinor (fact attr).version;
    libPrefix = "python${lib.versions.majorMinor (fact attr).version}";
    pkgs = final.python3Packages;
    withPackages =
      f:
      mkDrv {
        name = "python${lib.versions.majorMinor (fact attr).version}-env";
        packages = f final.python3Packages;
      };
  };

  base = final: {
    inherit lib config;
    stdenv = {
      name = "stdenv-linux";
      hostPlatform.system = system;
      cc = mkDrv {
        pname = "gcc-wrapper";
        version = "14";
      }
      // {
        cc = mkDrv {
          pname = "gcc";
          version = "14";
          outputs = [
            "out"
            "lib"
          ];
        };
      };
    };
    autoPatchelfHook = mkDrv { name = "auto-patchelf-hook"; };
    numactl = mkDrv {
      pname = "numactl";
      inherit ((fact "numactl")) version;
      meta = metaFrom (fact "numactl");
    };
    callPackage = callPackageWith final;

    inherit cudaPackages_13_2;
    cudaPackages = throw "fake nixpkgs: default cudaPackages (cudaPackages_12_9 in nixpkgs) used instead of the overlay's";
    # lib.makeExtensible-like: `extend` takes `final: prev: attrs`.
    _cuda = mkExtensible {
      extensions = [ ];
      lib = cudaLib;
    };

    cmake = mkDrv {
      pname = "cmake";
      inherit ((fact "cmake")) version;
    };
    cmakeMinimal = final.cmake;
    ruff = mkDrv {
      pname = "ruff";
      inherit ((fact "ruff")) version;
      meta.mainProgram = "ruff";
    };
    nix = mkDrv {
      pname = "nix";
      version = "2.34";
    };
    python3 = mkPythonFor final "python314";
    python314 = mkPythonFor final "python314";
    python313 = mkPythonFor final "python313";
    python312 = mkPythonFor final "python312";
    pythonPackagesExtensions = [ ];
    python3Packages = lib.fix (
      b.foldl' (acc: ext: lib.extends ext acc) (pyBase final) final.pythonPackagesExtensions
    );

    runCommand =
      name: env: script:
      mkDrv (env // { inherit name; buildCommand = script; });
    stdenvNoCC.mkDerivation = attrs: mkDrv attrs;
    symlinkJoin = attrs: mkDrv attrs;
    # pkgs/build-support/mkshell: callPackage'd, so `mkShell.override { stdenv = …; }` works
    mkShell = final.callPackage (
      { stdenv }:
      attrs:
      let
        shell = mkDrv (attrs // { name = attrs.name or "shell"; stdenvName = stdenv.name; });
      in
      # make-derivation.nix gives every derivation `inputDerivation` (a derivation of its inputs)
      shell // { inputDerivation = mkDrv { name = "${shell.name}-inputs"; }; }
    ) { };
    writeShellScript = name: text: mkDrv { inherit name text; };
    linkFarm = name: entries: mkDrv { inherit name entries; };
    writeShellScriptBin =
      name: text:
      mkDrv {
        inherit name text;
        meta.mainProgram = name;
      };
  };

  # Every Python package the facts record (kind "package"), as a plain buildPythonPackage with
  # the fact's version and meta; the few whose function the overlays override take the
  # argument set the facts record.
  pythonNames = map (n: b.substring 16 (b.stringLength n) n) (
    b.filter (n: b.substring 0 16 n == "python3Packages." && facts.${n}.kind == "package") (b.attrNames facts)
  );
  notInThisRevision =
    lib.optionals (!withSglang) [
      "sglang"
      "sglang-kernel"
    ]
    ++ withoutPython;

  pyBase =
    pkgs: pyFinal:
    let
      callPy = callPackageWith (pkgs // pyFinal);
      simple =
        pname:
        let
          f = fact "python3Packages.${pname}";
        in
        buildPythonPackage {
          inherit pname;
          version = if f.version == null then "0" else f.version;
          outputs = f.outputs or [ "out" ];
          meta = metaFrom f;
        };
      special = {
        # pkgs/development/python-modules/sglang-kernel/default.nix (arguments and the attributes
        # the overlay extends: src, patches, cmakeFlags, preBuild)
        sglang-kernel =
          let
            f = fact "python3Packages.sglang-kernel";
          in
          callPy (withFactArgs f (
            args:
            buildPythonPackage {
              pname = "sglang-kernel";
              inherit (f) version;
              src = mkDrv { name = "source"; } // {
                rev = "156d1af23a4fa80809ab423bc1042d732ef6f95f";
              };
              sourceRoot = "source/sgl-kernel";
              patches = [
                "version-number.patch"
                "no-repo-fmt.patch"
              ];
              cmakeFlags = [ (lib.cmakeFeature "CUDA_VERSION" args.cudaPackages.cudaMajorMinorVersion) ];
              preBuild = "export CMAKE_BUILD_PARALLEL_LEVEL=$NIX_BUILD_CORES\n";
              dependencies = [ args.torch ];
              meta = metaFrom f;
            }
          )) { };
        # pkgs/development/python-modules/sglang/default.nix @ 3983fac: its dependencies are the
        # Python packages among its arguments (the file lists them flat, for every platform)
        sglang =
          let
            f = fact "python3Packages.sglang";
          in
          buildPythonPackage {
            pname = "sglang";
            inherit (f) version;
            dependencies = map (n: pyFinal.${n}) (b.filter (n: b.elem n pythonNames) f.args);
            meta = metaFrom f;
          };
        # pkgs/development/python-modules/transformer-engine/default.nix (its argument set per version)
        transformer-engine =
          let
            f = fact "python3Packages.transformer-engine";
          in
          callPy (withFactArgs f (
            args:
            let
              withJax = args.withJax or true;
            in
            buildPythonPackage {
              pname = "transformer-engine";
              inherit (f) version;
              inherit withJax;
              withPytorch = args.withPytorch or true;
              # null where this version has no such argument
              withNcclEp = if b.elem "withNcclEp ? true" f.args then args.withNcclEp or true else null;
              buildInputs = [
                args.cudaPackages.cuda_nvtx
                args.cudaPackages.cuda_profiler_api
                args.cudaPackages.cudnn
              ];
              env = {
                NVTE_FRAMEWORK = if withJax then "jax,pytorch" else "pytorch";
              };
              preBuild = "export NVTE_BUILD_MAX_JOBS=$NIX_BUILD_CORES\n";
              meta = metaFrom f;
            }
          )) { };
      };
    in
    {
      inherit buildPythonPackage;
      callPackage = callPy;
      # the interpreter of this set (shared by the fake's python3 and python313: see mkPythonFor)
      python = {
        pythonVersion = "3.13";
        sitePackages = "lib/python3.13/site-packages";
      };
      # pkgs/build-support/fetchpypi: sdist by default, or a wheel with format/dist/python/abi/platform
      fetchPypi =
        {
          pname,
          version,
          hash,
          format ? "setuptools",
          dist ? "source",
          python ? "py3",
          abi ? "none",
          platform ? "any",
        }:
        mkDrv {
          name =
            if format == "wheel" then
              "${pname}-${version}-${python}-${abi}-${platform}.whl"
            else
              "${pname}-${version}.tar.gz";
          inherit hash dist;
        };
      pythonOlder = v: b.compareVersions "3.13" v < 0;
    }
    // b.listToAttrs (
      map (name: {
        inherit name;
        value = special.${name} or (simple name);
      }) (lib.subtractLists notInThisRevision pythonNames)
    );

  pkgs = lib.fix (b.foldl' (acc: overlay: lib.extends overlay acc) base overlays);
in
pkgs
