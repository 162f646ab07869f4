/*
 * cuda_cpu/numerics.cpp: GPU numerics (a build with CUDA_CPU_NUMERICS=gpu; the routing of
 * the math calls is at the end of cuda_cpu.h, the compiler flags in cuda_cpu/nvcc).
 *
 * In device code each routed function returns its correctly rounded result moved by the
 * largest error CUDA documents for it, up or down as a hash of the arguments says: a fixed
 * function of its inputs, as a GPU's is, that no test can tune itself to. The bounds:
 *   CUDA C++ Programming Guide, Mathematical Functions appendix, in ulps of the correctly
 *   rounded result ("Single-Precision Mathematical Standard Library Functions" and
 *   "Single-Precision Floating-Point Intrinsic Functions"):
 *     expf 2, logf 1, tanhf 2, rsqrtf 2, sqrtf 0 (-prec-sqrt=true, nvcc's default);
 *     __expf 2 + floor(|1.173 x|); __logf: absolute error 2^-21.41 for x in [0.5, 2], else
 *     3; __fdividef(x, y): 2 for |y| in [2^-126, 2^126], and 0 (x finite) or NaN (x
 *     infinite) for 2^126 < |y| < 2^128
 *   --use_fast_math (nvcc 13 compiles expf to ex2.approx.ftz, logf to lg2.approx.ftz,
 *   tanhf to tanh.approx, sqrtf to sqrt.approx.ftz): expf and logf are __expf and __logf;
 *   the PTX ISA ("Floating Point Instructions") bounds the others' relative error:
 *     tanh.approx.f32 2^-11 (subnormal inputs passed through), sqrt.approx.f32 2^-23
 * Zero, infinite and NaN results are left as they are. Under --use_fast_math (ftz) a result
 * below FLT_MIN is flushed to a zero of its sign (tanhf's excepted), and kernel.cpp runs the
 * kernel with the CPU's flush-to-zero and denormals-are-zero modes. Host code (no kernel
 * running on the thread) gets glibc's functions, as on a GPU build.
 */
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda_cpu.h"  // the qualifiers before the toolkit's headers (internal.h)
#include "internal.h"

namespace cudacpu {
bool in_kernel();  // kernel.cpp

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// By the bits: with denormals-are-zero on (kernel.cpp) a subnormal compares equal to 0.
static bool subnormal(float f) { return (bits_of(f) & 0x7f800000u) == 0 && (bits_of(f) & 0x007fffffu) != 0; }

// Up (true) or down: a hash of the function and its arguments (splitmix64's finalizer).
static bool up(int fn, float x, float y) {
    static const uint64_t seed = (uint64_t)env_long("SEED", 1);
    uint64_t z = ((uint64_t)bits_of(x) << 32 | bits_of(y)) ^ ((uint64_t)fn << 56) ^ (seed * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((z ^ (z >> 31)) & 1) != 0;
}

// r moved by `ulps` steps of the float grid, away from zero when `away`, never past the
// largest finite float nor through zero.
static float step(float r, uint32_t ulps, bool away) {
    if (ulps == 0 || r == 0.0f || !std::isfinite(r)) return r;
    uint32_t u = bits_of(r), mag = u & 0x7fffffffu, sign = u & 0x80000000u;
    if (away) mag = mag + ulps > 0x7f7fffffu ? 0x7f7fffffu : mag + ulps;
    else mag = mag > ulps ? mag - ulps : 0;
    return float_of(sign | mag);
}

// The float farthest from exact, up or down, within err of it (an absolute error bound).
static float within(double exact, double err, bool away) {
    float r = (float)(exact + (away == (exact >= 0) ? err : -err));
    if (fabs((double)r - exact) > err) r = nextafterf(r, (float)exact);
    return r;
}

float gpu_math(int fn, float x, float y, bool ftz) {
    if (!in_kernel()) {
        switch (fn) {
            case GPU_EXPF: case GPU_FAST_EXPF: return expf(x);
            case GPU_LOGF: case GPU_FAST_LOGF: return logf(x);
            case GPU_TANHF: case GPU_FAST_TANHF: return tanhf(x);
            case GPU_SQRTF: case GPU_FAST_SQRTF: return sqrtf(x);
            case GPU_RSQRTF: return 1.0f / sqrtf(x);
            case GPU_FAST_DIVIDEF: return x / y;
        }
    }
    bool away = up(fn, x, y);
    float r = 0.0f;
    switch (fn) {
        case GPU_EXPF: r = step((float)exp((double)x), 2, away); break;
        case GPU_LOGF: r = step((float)log((double)x), 1, away); break;
        case GPU_TANHF: r = step((float)tanh((double)x), 2, away); break;
        case GPU_SQRTF: r = sqrtf(x); break;
        case GPU_RSQRTF: r = step((float)(1.0 / sqrt((double)x)), 2, away); break;
        case GPU_FAST_SQRTF: r = within(sqrt((double)x), exp2(-23) * sqrt((double)x), away); break;
        case GPU_FAST_TANHF:
            if (subnormal(x)) return x;  // passed through, ftz or not
            r = within(tanh((double)x), exp2(-11) * fabs(tanh((double)x)), away);
            break;
        case GPU_FAST_EXPF: r = step((float)exp((double)x), 2 + (uint32_t)floor(fabs(1.173 * (double)x)), away); break;
        case GPU_FAST_LOGF:
            if (x >= 0.5f && x <= 2.0f) r = within(log((double)x), exp2(-21.41), away);
            else r = step((float)log((double)x), 3, away);
            break;
        case GPU_FAST_DIVIDEF: {
            float ay = fabsf(y);
            if (ay > 0x1p126f && std::isfinite(ay)) r = std::isinf(x) ? NAN : 0.0f;
            else if (ay >= 0x1p-126f && ay <= 0x1p126f) r = step((float)((double)x / (double)y), 2, away);
            else r = x / y;
            break;
        }
    }
    if (ftz && subnormal(r)) r = copysignf(0.0f, r);
    return r;
}

}  // namespace cudacpu
