
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool live) {  // zeros if !live
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(live ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// Codes k, k+1 (byte `sel` of w: 0x4440 + i picks byte i, zero above) -> BF16x2 e2m1 * s * 2**-7.
__device__ __forceinline__ u32 decode_byte(u32 w, u32 sel, u32 scale2) {
    const u32 b = __byte_perm(w, 0u, sel);
    const u32 bits = ((b * 262208u) & 0x01C001C0u) | ((b * 16781312u) & 0x80008000u);
    u32 r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(scale2));
    return r;
}

// Scale code byte j (a constant after unrolling) of w -> BF16 s * 2**119 in both halves (the code is
// (bits - (237 << 7)) >> 4: one shift-and-add per half, both halves at once).
__device__ __forceinline__ u32 scale_pair(u32 w, int j) {
    return __byte_perm(w, 0u, 0x4040u | (j << 8) | j) * 16u + ((237u << 7) | (237u << 23));
}
