__device__ __forceinline__ void wgmma_step(float* d, const u32* a, unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n@BM@k16.f32.bf16.bf16 {@ACC@}, {%@N0@,%@N1@,%@N2@,%@N3@}, %@N4@, p, 1, 1, 0;\n}\n"
                 : @OPERANDS@
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
