/*
 * cuda_cpu/include/mma.h: the warp matrix functions (nvcuda::wmma) on the CPU execution
 * layer. cuda_cpu/nvcc puts cuda_cpu/include first on the include path, so a .cu
 * file's `#include <mma.h>` finds this file there; a real nvcc build gets the toolkit's.
 *
 * What exists (the CUDA C++ Programming Guide, "Warp Matrix Functions", for m16n16k16):
 *   fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | __half, row_major | col_major>
 *   fragment<accumulator, 16, 16, 16, float>
 *   fill_fragment, load_matrix_sync (accumulators with mem_row_major / mem_col_major),
 *   store_matrix_sync (float accumulators), mma_sync (d = a b + c; satf must be false).
 * Other shapes and types fail to compile (a static_assert names what is missing).
 *
 * Fragments. A fragment is warp-wide: each of the 32 lanes holds num_elements = 8 of the
 * tile's 256 elements in x[]. CUDA leaves the mapping unspecified; here element i of lane
 * l is the tile's element i * 32 + l in row-major order (row (i*32+l) / 16, column
 * (i*32+l) % 16), deliberately unlike any hardware mapping, so code that guesses one
 * shows wrong results here. Uniform elementwise work on x[] (scaling, conversion) is
 * what the mapping allows, as on a GPU.
 *
 * Warp-collective calls. load_matrix_sync, store_matrix_sync and mma_sync are whole-warp
 * operations (cudacpu::warp_custom): every lane publishes a pointer to its arguments, and
 * the last lane to arrive does the whole warp's work while the others are suspended (one
 * switch per lane, like a shuffle; no per-element switching), then all go on. So each lane
 * sees the others' fragments exactly as they were at the call, and none can overwrite
 * its own before the others have read it. fill_fragment is lane-local (a common value).
 * What the Guide calls undefined stops the kernel with a layer fault (sticky
 * cudaErrorLaunchFailure, naming the kernel, block and warp): lanes that disagree on the
 * pointer, ldm or layout; a pointer not 256-bit (32-byte) aligned; ldm not a multiple of
 * 16 bytes (8 bf16/half elements, 4 floats); a warp with fewer than 32 lanes taking part
 * (a lane that returned, one waiting elsewhere, a block whose last warp is partial).
 *
 * Under the layer's tools (CUDA_CPU_TOOLS=1 builds: docs/cuda_cpu.md) a load or store reports
 * the accesses a GPU makes for it, lane by lane, in the fragment layouts the PTX ISA
 * documents for mma.m16n8k16 ("Matrix Fragments for mma.m16n8k16 with floating point
 * type"; m16n16k16 is two of them side by side in n): see ptx_element below. Each lane
 * moves its fragment one 32-bit register at a time (two 16-bit elements, or two
 * adjacent f32 accumulators as one 8-byte access), as one access where the pair is
 * adjacent in memory and as two where it is not; each register index is one warp-wide
 * request.
 *
 * Precision contract. mma_sync computes each element of d as c[i][j] plus the 16
 * products a[i][k] * b[k][j]. By default (IEEE numerics) they are added one after another
 * in k order (k = 0..15), each sum rounded to fp32 (round to nearest even). A product of
 * two bf16 or two half values is exact in fp32 (8 x 8 and 11 x 11 significand bits), so
 * the only roundings are the 16 additions, unless a bf16 product leaves fp32's range
 * (overflow to inf, underflow below 2^-126 with gradual loss). A build with GPU numerics
 * (CUDA_CPU_NUMERICS=gpu) adds as the tensor cores do by the published measurements
 * (cudacpu::tc_dot, tensorcore.cpp): groups of products fused with the accumulator,
 * aligned to the largest exponent, truncated, and the sum rounded toward zero. CUDA
 * specifies neither order nor internal precision: tests must allow both models' errors.
 */
#ifndef CUDA_CPU_MMA_H
#define CUDA_CPU_MMA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#ifdef __CUDA_CPU_GPU_NUMERICS__
namespace cudacpu {  // tensorcore.h
float tc_dot(float c, const float* a, const float* b, int k, int min_exp);
}
#endif

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;

enum layout_t { mem_row_major, mem_col_major };

namespace cpu_detail {
static const int kLanes = 32;
static const int kTile = 16;                       // m = n = k = 16
static const int kPerLane = kTile * kTile / kLanes;  // 8

template <int M, int N, int K>
struct ShapeSupported : std::integral_constant<bool, M == 16 && N == 16 && K == 16> {};

// Element i of a lane holds the tile element at row-major index i * 32 + lane.
static inline int tile_index(int i, int lane) { return i * kLanes + lane; }

static inline float to_f32(float x) { return x; }
static inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float to_f32(__half x) { return __half2float(x); }
}  // namespace cpu_detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
    static_assert(cpu_detail::ShapeSupported<M, N, K>::value,
                  "cuda_cpu WMMA: only the m16n16k16 shape is implemented on the CPU layer");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_same<T, float>::value && std::is_void<Layout>::value
                      : (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) &&
                            (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value),
                  "cuda_cpu WMMA: implemented are matrix_a/matrix_b of __nv_bfloat16 or __half with row_major or "
                  "col_major, and float accumulators (no layout)");

   public:
    enum { num_elements = cpu_detail::kPerLane, num_storage_elements = cpu_detail::kPerLane };
    typedef T element_type;
    typedef T storage_element_type;
    typedef Use use_type;  // the layer's own (its tools' access model)
    T x[num_elements];
};

// v converts to the fragment's element type (a float fills a bf16 fragment, as with the
// toolkit's overload); lane-local: the mapping is unspecified, so all lanes pass one value.
template <typename Use, int M, int N, int K, typename T, typename Layout>
CUDA_CPU_NOT_TRACED inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f,
                          const typename fragment<Use, M, N, K, T, Layout>::element_type& v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

namespace cpu_detail {
// What a lane passes to a load or store: its fragment and the memory it names.
template <typename Frag, typename T>
struct MemoryArgs {
    Frag* frag;
    T* ptr;  // const T* for loads, cast away (never written then)
    unsigned ldm;
    bool row_major;  // how memory holds the tile
    const void* pc;  // the call site (under the tools)
};

CUDA_CPU_NOT_TRACED static inline const char* disagreement(void* const lanes[32], const void* (*ptr_of)(void*), unsigned (*ldm_of)(void*),
                                       bool (*row_of)(void*), size_t elem_bytes) {
    static thread_local char msg[320];
    const void* p0 = ptr_of(lanes[0]);
    unsigned l0 = ldm_of(lanes[0]);
    bool r0 = row_of(lanes[0]);
    for (int l = 1; l < kLanes; l++) {
        if (ptr_of(lanes[l]) != p0 || ldm_of(lanes[l]) != l0 || row_of(lanes[l]) != r0) {
            snprintf(msg, sizeof(msg),
                     "the lanes disagree (lane 0: pointer %p, ldm %u, %s; lane %d: pointer %p, ldm %u, %s); the "
                     "pointer, ldm and layout must be the same in every lane",
                     p0, l0, r0 ? "row-major" : "col-major", l, ptr_of(lanes[l]), ldm_of(lanes[l]),
                     row_of(lanes[l]) ? "row-major" : "col-major");
            return msg;
        }
    }
    if ((uintptr_t)p0 % 32 != 0) {
        snprintf(msg, sizeof(msg), "pointer %p is not 256-bit (32-byte) aligned", p0);
        return msg;
    }
    if (l0 * elem_bytes % 16 != 0 || l0 == 0) {
        snprintf(msg, sizeof(msg), "ldm %u is not a multiple of 16 bytes (%zu elements of %zu bytes)", l0,
                 16 / elem_bytes, elem_bytes);
        return msg;
    }
    return nullptr;
}

template <typename Args>
CUDA_CPU_NOT_TRACED const void* args_ptr(void* a) { return ((Args*)a)->ptr; }
template <typename Args>
CUDA_CPU_NOT_TRACED unsigned args_ldm(void* a) { return ((Args*)a)->ldm; }
template <typename Args>
CUDA_CPU_NOT_TRACED bool args_row(void* a) { return ((Args*)a)->row_major; }

// Memory element (r, c) of the tile the lanes name.
template <typename T>
static inline T* at(T* p, unsigned ldm, bool row_major, int r, int c) {
    return row_major ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r;
}

#ifdef __CUDA_CPU_TOOLS__
// Tile element (r, c) of element i of lane `lane`'s fragment in the PTX ISA's layouts for
// mma.m16n8k16 (g = lane / 4, t = lane % 4; B and the accumulator: elements 4..7 are the
// second 16 x 8 half, columns + 8):
//   matrix_a (m, k): i = 0,1: (g, 2t + i)      2,3: (g + 8, 2t + i - 2)
//                    i = 4,5: (g, 2t + i + 4)  6,7: (g + 8, 2t + i + 2)
//   matrix_b (k, n): j = i % 4 = 0,1: (2t + j, g)      2,3: (2t + j + 6, g)
//   accumulator (m, n): j = 0,1: (g, 2t + j)            2,3: (g + 8, 2t + j - 2)
template <typename Use>
CUDA_CPU_NOT_TRACED static inline void ptx_element(int i, int lane, int* r, int* c) {
    int g = lane >> 2, t = lane & 3, j = i & 3, half = i >> 2;
    if (std::is_same<Use, matrix_a>::value) {
        *r = g + (j >= 2 ? 8 : 0);
        *c = 2 * t + (i & 1) + 8 * half;
    } else if (std::is_same<Use, matrix_b>::value) {
        *r = 2 * t + (i & 1) + (j >= 2 ? 8 : 0);
        *c = g + 8 * half;
    } else {
        *r = g + (j >= 2 ? 8 : 0);
        *c = 2 * t + (i & 1) + 8 * half;
    }
}

// What the warp's lanes access for a load or store of the tile at p (header comment).
template <typename Use, typename T>
CUDA_CPU_NOT_TRACED void report_copy(const void* pc, T* p, unsigned ldm, bool row_major, bool store) {
    cudacpu::ModeledAccess list[kLanes * kPerLane];
    int n = 0;
    for (int l = 0; l < kLanes; l++) {
        for (int i = 0; i < kPerLane; i += 2) {
            int r0, c0, r1, c1;
            ptx_element<Use>(i, l, &r0, &c0);
            ptx_element<Use>(i + 1, l, &r1, &c1);
            T *e0 = at(p, ldm, row_major, r0, c0), *e1 = at(p, ldm, row_major, r1, c1);
            unsigned short req = (unsigned short)(i / 2);
            if (e1 == e0 + 1) {
                list[n++] = cudacpu::ModeledAccess{e0, (unsigned short)(2 * sizeof(T)), req, (unsigned char)l, store};
            } else {
                list[n++] = cudacpu::ModeledAccess{e0, (unsigned short)sizeof(T), req, (unsigned char)l, store};
                list[n++] = cudacpu::ModeledAccess{e1, (unsigned short)sizeof(T), req, (unsigned char)l, store};
            }
        }
    }
    cudacpu::tools_modeled(pc, list, n);
}
#endif

// Loads (every lane's fragment from the tile) or stores (the tile from every lane's).
template <typename Frag, typename T, bool Store>
CUDA_CPU_NOT_TRACED const char* complete_copy(void* const lanes[32]) {
    typedef MemoryArgs<Frag, T> Args;
    const char* err = disagreement(lanes, args_ptr<Args>, args_ldm<Args>, args_row<Args>, sizeof(T));
    if (err) return err;
    const Args* a0 = (const Args*)lanes[0];
    for (int l = 0; l < kLanes; l++) {
        Frag* f = ((Args*)lanes[l])->frag;
        for (int i = 0; i < kPerLane; i++) {
            int t = tile_index(i, l);
            T* m = at(a0->ptr, a0->ldm, a0->row_major, t / kTile, t % kTile);
            if (Store) *m = f->x[i];
            else f->x[i] = *m;
        }
    }
#ifdef __CUDA_CPU_TOOLS__
    report_copy<typename Frag::use_type>(a0->pc, a0->ptr, a0->ldm, a0->row_major, Store);
#endif
    return nullptr;
}

template <typename FragD, typename FragA, typename FragB, typename FragC>
struct MmaArgs {
    FragD* d;
    const FragA* a;
    const FragB* b;
    const FragC* c;
    bool satf;
};

template <typename FragD, typename FragA, typename FragB, typename FragC>
CUDA_CPU_NOT_TRACED const char* complete_mma(void* const lanes[32]) {
    typedef MmaArgs<FragD, FragA, FragB, FragC> Args;
    float A[kTile][kTile], B[kTile][kTile];  // the operands, gathered from every lane
    for (int l = 0; l < kLanes; l++) {
        const Args* g = (const Args*)lanes[l];
        if (g->satf) return "satf = true (saturating accumulators) is not implemented on the CPU layer";
        for (int i = 0; i < kPerLane; i++) {
            int t = tile_index(i, l);
            A[t / kTile][t % kTile] = to_f32(g->a->x[i]);
            B[t / kTile][t % kTile] = to_f32(g->b->x[i]);
        }
    }
    // Each element: c plus the products, by the file's precision contract. Each output
    // element reads only its own element of c, so d may be c.
    for (int l = 0; l < kLanes; l++) {
        const Args* g = (const Args*)lanes[l];
        for (int i = 0; i < kPerLane; i++) {
            int t = tile_index(i, l), r = t / kTile, col = t % kTile;
            float acc = g->c->x[i];
#ifdef __CUDA_CPU_GPU_NUMERICS__
            float column[kTile];
            for (int k = 0; k < kTile; k++) column[k] = B[k][col];
            const int min_exp = std::is_same<typename FragA::element_type, __half>::value ? -14 : -126;
            acc = cudacpu::tc_dot(acc, A[r], column, kTile, min_exp);
#else
            for (int k = 0; k < kTile; k++) {
                float prod = A[r][k] * B[k][col];  // exact: see the header
                acc = acc + prod;
            }
#endif
            g->d->x[i] = acc;
        }
    }
#ifdef __CUDA_CPU_TOOLS__
    cudacpu::tools_mma();
#endif
    return nullptr;
}
}  // namespace cpu_detail

// matrix_a / matrix_b: the layout is the fragment's.
// Under the tools these are not inlined (CUDA_CPU_NOT_TRACED): their return address is the
// user's call site.
#ifdef __CUDA_CPU_TOOLS__
#define CUDA_CPU_CALL_SITE __builtin_return_address(0)
#else
#define CUDA_CPU_CALL_SITE nullptr
#endif

template <typename Use, int M, int N, int K, typename T, typename Layout>
CUDA_CPU_NOT_TRACED inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value,
                  "load_matrix_sync of an accumulator takes a layout_t (mem_row_major or mem_col_major)");
    typedef fragment<Use, M, N, K, T, Layout> Frag;
    cpu_detail::MemoryArgs<Frag, T> args = {&f, (T*)p, ldm, std::is_same<Layout, row_major>::value, CUDA_CPU_CALL_SITE};
    cudacpu::warp_custom("wmma::load_matrix_sync", &cpu_detail::complete_copy<Frag, T, false>, &args);
}

template <int M, int N, int K>
CUDA_CPU_NOT_TRACED inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                                                 layout_t layout) {
    typedef fragment<accumulator, M, N, K, float> Frag;
    cpu_detail::MemoryArgs<Frag, float> args = {&f, (float*)p, ldm, layout == mem_row_major, CUDA_CPU_CALL_SITE};
    cudacpu::warp_custom("wmma::load_matrix_sync", &cpu_detail::complete_copy<Frag, float, false>, &args);
}

template <int M, int N, int K>
CUDA_CPU_NOT_TRACED inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f,
                                                  unsigned ldm, layout_t layout) {
    typedef fragment<accumulator, M, N, K, float> Frag;
    cpu_detail::MemoryArgs<Frag, float> args = {(Frag*)&f, p, ldm, layout == mem_row_major, CUDA_CPU_CALL_SITE};
    cudacpu::warp_custom("wmma::store_matrix_sync", &cpu_detail::complete_copy<Frag, float, true>, &args);
}

template <int M, int N, int K, typename T, typename LayoutA, typename LayoutB>
CUDA_CPU_NOT_TRACED inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
                     const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c,
                     bool satf = false) {
    typedef fragment<accumulator, M, N, K, float> FragC;
    typedef fragment<matrix_a, M, N, K, T, LayoutA> FragA;
    typedef fragment<matrix_b, M, N, K, T, LayoutB> FragB;
    cpu_detail::MmaArgs<FragC, FragA, FragB, FragC> args = {&d, &a, &b, &c, satf};
    cudacpu::warp_custom("wmma::mma_sync", &cpu_detail::complete_mma<FragC, FragA, FragB, FragC>, &args);
}

}  // namespace wmma
}  // namespace nvcuda

#endif
