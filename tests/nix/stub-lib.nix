# A minimal stand-in for nixpkgs' `lib`, just the functions the flake uses, with the same results
# (checked against nixpkgs' lib: nix/README.md "Static tests"). Lets tests/nix evaluate the flake
# where nixpkgs cannot be fetched. Set SLIME_GB10_NIXPKGS_LIB=/path/to/nixpkgs/lib to run the same
# tests with the real lib instead.
let
  b = builtins;
  setFunctionArgs = f: args: {
    __functor = _: f;
    __functionArgs = args;
  };
  functionArgs = f: if f ? __functor then f.__functionArgs or (functionArgs (f.__functor f)) else b.functionArgs f;
  getOutput = output: pkg: if pkg ? outputSpecified && pkg.outputSpecified then pkg else pkg.${output} or pkg.out or pkg;
  getBin = getOutput "bin";
in
rec {
  inherit setFunctionArgs functionArgs getOutput getBin;
  inherit (b)
    all
    any
    attrNames
    concatStringsSep
    concatMap
    elem
    filter
    intersectAttrs
    isAttrs
    mapAttrs
    replaceStrings
    ;
  toList = x: if b.isList x then x else [ x ];
  unique = b.foldl' (acc: e: if b.elem e acc then acc else acc ++ [ e ]) [ ];
  subtractLists = e: b.filter (x: !(b.elem x e));
  versions.majorMinor =
    v:
    let
      parts = b.splitVersion v;
    in
    "${b.elemAt parts 0}.${b.elemAt parts 1}";
  warnIf = cond: msg: if cond then warn msg else x: x;
  optional = cond: x: if cond then [ x ] else [ ];
  optionals = cond: xs: if cond then xs else [ ];
  optionalString = cond: s: if cond then s else "";
  optionalAttrs = cond: as: if cond then as else { };
  warn = msg: builtins.trace "evaluation warning: ${msg}";
  assertOneOf =
    name: val: xs:
    if b.elem val xs then true else throw "${name} must be one of ${b.toJSON xs}, but is: ${b.toJSON val}";
  boolToString = x: if x then "true" else "false";
  stringToCharacters = s: b.genList (i: b.substring i 1 s) (b.stringLength s);
  toUpper = s: b.replaceStrings (stringToCharacters "abcdefghijklmnopqrstuvwxyz") (stringToCharacters "ABCDEFGHIJKLMNOPQRSTUVWXYZ") s;
  cmakeOptionType = type: feature: value: "-D${feature}:${toUpper type}=${value}";
  cmakeBool = condition: flag: cmakeOptionType "bool" condition (toUpper (boolToString flag));
  cmakeFeature = feature: value: cmakeOptionType "string" feature value;
  getLib = getOutput "lib";
  getDev = getOutput "dev";
  getInclude = getOutput "include";
  getExe = x: getExe' x (x.meta.mainProgram or (throw "getExe: ${x.name or "?"} has no meta.mainProgram"));
  getExe' = x: y: "${getBin x}/bin/${y}";
  getName = x: x.pname or (b.parseDrvName x.name).name;
  versionAtLeast = v1: v2: b.compareVersions v1 v2 >= 0;
  assertMsg = pred: msg: pred || b.throw msg;
  genAttrs = names: f: b.listToAttrs (map (n: { name = n; value = f n; }) names);
  mapAttrsToList = f: as: map (n: f n as.${n}) (b.attrNames as);
  fix = f: let x = f x; in x;
  extends = overlay: f: self: let super = f self; in super // overlay self super;
  composeManyExtensions = b.foldl' (acc: o: final: prev: let p1 = acc final prev; in p1 // o final (prev // p1)) (_: _: { });
  makeOverridable =
    f: args:
    let
      result = f args;
      override = setFunctionArgs (newArgs: makeOverridable f (args // newArgs)) (functionArgs f);
    in
    if b.isAttrs result then
      result
      // {
        inherit override;
        overrideDerivation = throw "stub lib: overrideDerivation";
      }
    else if b.isFunction result then
      setFunctionArgs result (functionArgs result) // { inherit override; }
    else
      result;
  fileset = {
    toSource = { root, fileset }: root;
    unions = b.foldl' (a: x: a ++ [ x ]) [ ];
    # Exercise the predicate on a few names so a typo in it is an evaluation error.
    fileFilter =
      pred: path:
      let
        file = name: {
          inherit name;
          hasExt = ext: b.match ".*\\.${ext}" name != null;
        };
      in
      b.seq (b.all (n: b.isBool (pred (file n))) [ "a.py" "py.typed" "c.json" "d.txt" ]) path;
  };
  sourceTypes = {
    fromSource = { isSource = true; };
    binaryNativeCode = { isSource = false; };
  };
  # lib/licenses.nix: the licences tests/nix/nixpkgs-facts.json names (shortName, free as there;
  # nvidiaCudaRedist from lib/licenses.nix, cudnn from _cuda/lib/licenses.nix @ 0628f24)
  licenses =
    b.mapAttrs
      (name: free: {
        shortName = name;
        inherit free;
      })
      {
        asl20 = true;
        bsd0 = true;
        bsd2 = true;
        bsd3 = true;
        gpl2Only = true;
        lgpl21 = true;
        lgpl3 = true;
        lgpl3Only = true;
        mit = true;
        mit-cmu = true;
        mpl20 = true;
        psfl = true;
        unlicense = true;
        unfreeRedistributable = false;
      }
    // {
      nvidiaCudaRedist = {
        shortName = "CUDA EULA";
        free = false;
        redistributable = true;
      };
      cudnn = {
        shortName = "cuDNN EULA";
        free = false;
        redistributable = false;
      };
    };
  platforms = {
    linux = [
      "aarch64-linux"
      "x86_64-linux"
    ];
    all = [
      "aarch64-linux"
      "x86_64-linux"
      "aarch64-darwin"
      "x86_64-darwin"
    ];
  };
}
