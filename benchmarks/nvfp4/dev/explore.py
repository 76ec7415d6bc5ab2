"""Device exploration for the NVFP4 kernels: a subset of ``slime-gb10 bench nvfp4`` (the real
benchmark), with chosen shapes and M values, writing the JSON and the table under $OUT.

    python3 benchmarks/nvfp4/dev/explore.py --m 1,16,64,256,4096 --shapes 4096x4096,14336x4096
"""

import argparse
import datetime
import json
import os

from slime_gb10.bench import nvfp4 as bench

parser = argparse.ArgumentParser()
parser.add_argument("--m", default="1,16,64,256,4096")
parser.add_argument("--shapes", default="4096x4096,14336x4096")
parser.add_argument("--no-quantize", action="store_true")
parser.add_argument("--no-tune", action="store_true")
args = parser.parse_args()
copy = bench.measure_copy_bandwidth()
tflops = bench.measure_bf16_gemm()
result = {
    "device": __import__("torch").cuda.get_device_name(0),
    "capability": list(__import__("torch").cuda.get_device_capability(0)),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "torch": __import__("torch").__version__,
    "triton": __import__("triton").__version__,
    "copy_bandwidth_GBps": copy,
    "bf16_gemm_TFLOPS": tflops,
    "quantize": [] if args.no_quantize else bench.bench_quantize(copy, bench.QUANTIZE_SHAPES[:1]),
    "w4a16": bench.bench_w4a16(
        copy,
        tflops,
        tuple(int(m) for m in args.m.split(",")),
        tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")),
        tune=not args.no_tune,
    ),
}
out = os.environ.get("OUT", ".")
with open(os.path.join(out, "explore.json"), "w") as f:
    json.dump(result, f, indent=2)
print(bench.format_table(result))
for r in result["w4a16"]:
    print(r["M"], r["N"], r["K"], "best", r.get("fused_config"), "errors", len(r["errors"]), r["errors"][:2])
