/*
 * cuda_cpu/cuda_cpu.h: what a .cu file needs to compile as host C++ on the CPU
 * execution layer. cuda_cpu/nvcc force-includes it ahead of every CUDA source
 * (g++ -include), after cuda_cpu/rewrite.py has turned `k<<<g, b, s, st>>>(args)`
 * into `cudacpu_kernel(k, "k", __FILE__, __LINE__).config(g, b, s, st).launch(args)` and
 * each `__shared__` declaration into a block-shared one (same lines, same columns before).
 *
 * Device code runs as plain C++: the threads of a block are fibers on one worker thread
 * (cuda_cpu/kernel.cpp; a launch's blocks may run on several workers at once),
 * threadIdx & co. are that fiber's, __shared__ variables are thread_local statics (one copy
 * per worker, poisoned at every block start), and the barriers and warp collectives switch
 * fibers. The CUDA toolkit's own headers provide the
 * types (dim3, uint3, __nv_bfloat16 with its host arithmetic); this file the rest.
 */
#ifndef CUDA_CPU_H
#define CUDA_CPU_H

// Function-space qualifiers mean nothing on the host; defined before the toolkit's
// host_defines.h, which keeps a definition it finds.
#define __host__
#define __device__
#define __global__
#define __shared__ static thread_local
#define __constant__ static
#define __managed__
#define __launch_bounds__(...)  // rewrite.py registers them (KernelBounds below)
// The layer's documented macro (README.md): how a program asks whether it runs here.
#define __CUDA_CPU__ 1
// Kernels of a translation unit built with GPU numerics and --use_fast_math run with
// denormals flushed to zero (the launch carries it: kernel.cpp).
#if defined(__CUDA_CPU_GPU_NUMERICS__) && defined(__CUDA_CPU_FAST_MATH__)
#define CUDA_CPU_FTZ true
#else
#define CUDA_CPU_FTZ false
#endif

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cudacpu {

// The running fiber's coordinates (kernel.cpp sets them before every switch), one set per
// worker thread. Plain uint3 (blockDim and gridDim are dim3 in CUDA, which converts from
// uint3), so that the thread_local is constant-initialized; declared so (g++'s
// __constinit), a kernel reads it without first checking for a TLS init function.
struct ThreadCoords {
    uint3 thread_idx, block_idx, block_dim, grid_dim;
};
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
extern thread_local __constinit ThreadCoords coords;
#else
extern thread_local ThreadCoords coords;
#endif

void block_barrier(void);
int block_barrier_count(int predicate);  // __syncthreads_count; _and/_or from it
// Warp collectives: every lane named in mask meets here; kind and argument decide what
// each gets back (see kernel.cpp).
enum WarpOp { WARP_SYNC, WARP_SHFL, WARP_SHFL_UP, WARP_SHFL_DOWN, WARP_SHFL_XOR, WARP_BALLOT, WARP_ANY, WARP_ALL, WARP_CUSTOM };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);
// A whole-warp operation of the layer's own (the WMMA functions, cuda_cpu/include/mma.h):
// all 32 lanes of the warp call it with the same complete function, each with a pointer to
// its own arguments. Once the last lane has arrived (all others suspended in the call, so
// every lane's data stays put), complete(lanes) runs once, on the arriving lane's stack,
// with lanes[l] = lane l's pointer; it does the whole warp's work. It returns NULL, or a
// message that ends the kernel as a fault ("<name>: <message>"). The lanes then go on.
typedef const char* (*WarpComplete)(void* const lanes[32]);
void warp_custom(const char* name, WarpComplete complete, void* lane_data);
unsigned active_mask(void);
// A __shared__ variable's first declaration in a block (rewrite.py emits the calls).
void shared_declared(void* address, size_t bytes, const char* name);
void* dynamic_shared(void);  // extern __shared__ arrays
long long clock_cycles(void);
// cuBLASLt matmul, layout and preference descriptors created and not destroyed (blas.cpp).
long blas_live_descriptors(void);

// ---- the sanitizer and profiler (cuda_cpu/tools.h; builds with CUDA_CPU_TOOLS=1) ------
// Such builds compile kernels with g++'s -fsanitize=address hooks and define
// __CUDA_CPU_TOOLS__; the layer's own whole-warp operations (WMMA) then report the
// accesses the hardware would make, lane by lane: each of `n` entries one lane's access,
// `request` numbering the warp-wide memory instructions of the operation. pc: the user's
// call site.
struct ModeledAccess {
    const void* addr;
    unsigned short size, request;
    unsigned char lane;
    bool store;
};
void tools_modeled(const void* pc, const ModeledAccess* accesses, int n);
void tools_mma(void);  // one warp's m16n16k16 product: 2 x 16^3 FLOPs
// An atomic access of `size` bytes at p by the instruction pc (the atomics below, which
// the instrumentation would take for plain stores).
void tools_atomic(const void* p, unsigned size, const void* pc);
#ifdef __CUDA_CPU_TOOLS__
#define CUDA_CPU_NOT_TRACED __attribute__((no_sanitize_address, noinline))  // the layer's own accesses
#define CUDA_CPU_ATOMIC_SEEN(p) cudacpu::tools_atomic((p), sizeof(*(p)), __builtin_return_address(0))
// A __shared__ variable as the kernel sees it (rewrite.py): through a pointer the compiler
// cannot see through, so that accesses at constant offsets are instrumented too.
#define CUDA_CPU_SHARED_VIEW(p) cudacpu::opaque_pointer(p)
template <typename T>
static inline T* opaque_pointer(T* p) {
    __asm__("" : "+r"(p));
    return p;
}
// #pragma unroll (rewrite.py): g++ unrolls as nvcc would, so that an array indexed by the
// loop's counter is registers, as on a GPU, not local memory.
#define CUDA_CPU_PRAGMA(x) _Pragma(#x)
#define CUDA_CPU_UNROLL CUDA_CPU_PRAGMA(GCC unroll 64)
#define CUDA_CPU_UNROLL_N(n) CUDA_CPU_PRAGMA(GCC unroll n)
#else
#define CUDA_CPU_NOT_TRACED
#define CUDA_CPU_ATOMIC_SEEN(p) ((void)0)
#define CUDA_CPU_SHARED_VIEW(p) (p)
#define CUDA_CPU_UNROLL
#define CUDA_CPU_UNROLL_N(n)
#endif

// ---- launches ------------------------------------------------------------------------
struct LaunchSite {
    const char* kernel;
    const char* file;
    int line;
    bool ftz;  // flush denormals to zero while it runs (CUDA_CPU_FTZ of the launching translation unit)
};
// One pointer argument of a launch, checked against the device allocations at launch.
struct PointerArg {
    int index;
    const void* value;
};
// Queues a launch (kernel.cpp): run(payload) runs the kernel body for the current fiber.
void launch(const LaunchSite& site, const void* func, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
            void (*run)(void*), std::shared_ptr<void> payload, const PointerArg* pointers, int num_pointers);

template <typename... P>
struct KernelCall {
    void (*func)(P...);
    LaunchSite site;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;

    // The arguments are copied now (as CUDA copies them at launch), converted to the
    // kernel's parameter types by the call itself (so NULL becomes a pointer, as in a plain
    // call); every thread calls the kernel with these values.
    void launch(std::decay_t<P>... args) const {
        using Args = std::tuple<std::decay_t<P>...>;
        struct Payload {
            void (*func)(P...);
            Args args;
        };
        auto p = std::make_shared<Payload>(Payload{func, Args(args...)});
        PointerArg pointers[sizeof...(P) + 1];
        int n = 0;
        collect_pointers(p->args, pointers, &n, std::index_sequence_for<P...>{});
        cudacpu::launch(site, (const void*)func, grid, block, shmem, stream, &run_body<Payload>, p, pointers, n);
    }

   private:
    template <typename Tuple, size_t... I>
    static void collect_pointers(const Tuple& t, PointerArg* out, int* n, std::index_sequence<I...>) {
        (void)t;
        (void)out;
        (void)n;
        (add_pointer(std::get<I>(t), (int)I, out, n), ...);
    }
    template <typename T>
    static void add_pointer(const T& v, int index, PointerArg* out, int* n) {
        if constexpr (std::is_pointer<T>::value) out[(*n)++] = PointerArg{index, (const void*)v};
    }
    template <typename Payload>
    CUDA_CPU_NOT_TRACED static void run_body(void* raw) {
        Payload* p = (Payload*)raw;
        std::apply(p->func, p->args);
    }
};

template <typename... P>
struct KernelRef {
    void (*func)(P...);
    LaunchSite site;
    KernelCall<P...> config(dim3 grid, dim3 block, size_t shmem = 0, cudaStream_t stream = 0) const {
        return KernelCall<P...>{func, site, grid, block, shmem, stream};
    }
};

// What each kernel registers before main (rewrite.py odr-uses these static members in its
// body, so every instantiation's initializer runs at start-up; kernel_attributes.cpp): its
// __launch_bounds__ (0: none) and each static __shared__ variable of its own body (id: where
// it is declared, so that each counts once).
bool kernel_bounds(const void* func, int max_threads, int min_blocks);
bool kernel_static_shared(const void* func, unsigned id, size_t bytes);
template <auto F, int MaxThreads, int MinBlocks>
struct KernelBounds {
    static const bool registered;
};
template <auto F, int MaxThreads, int MinBlocks>
const bool KernelBounds<F, MaxThreads, MinBlocks>::registered = kernel_bounds((const void*)F, MaxThreads, MinBlocks);
template <auto F, unsigned Id, size_t Bytes>
struct KernelStaticShared {
    static const bool registered;
};
template <auto F, unsigned Id, size_t Bytes>
const bool KernelStaticShared<F, Id, Bytes>::registered = kernel_static_shared((const void*)F, Id, Bytes);

}  // namespace cudacpu

// The C++ overloads that take a kernel itself, as cuda_runtime.h declares them for nvcc only
// (under __CUDACC__, which the layer does not define).
template <class T>
static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, T* entry) {
    return ::cudaFuncGetAttributes(attr, (const void*)entry);
}
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T* func, enum cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute((const void*)func, attr, value);
}

template <typename... P>
static inline cudacpu::KernelRef<P...> cudacpu_kernel(void (*func)(P...), const char* name, const char* file,
                                                      int line) {
    return cudacpu::KernelRef<P...>{func, {name, file, line, CUDA_CPU_FTZ}};
}

// ---- built-in variables ---------------------------------------------------------------
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (::cudacpu::coords.thread_idx)
#define blockIdx (::cudacpu::coords.block_idx)
#define blockDim (::cudacpu::coords.block_dim)
#define gridDim (::cudacpu::coords.grid_dim)
constexpr int warpSize = 32;

// ---- synchronization ------------------------------------------------------------------
static inline void __syncthreads(void) { cudacpu::block_barrier(); }
static inline int __syncthreads_count(int p) { return cudacpu::block_barrier_count(p); }
static inline int __syncthreads_and(int p) {
    return cudacpu::block_barrier_count(p) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
static inline int __syncthreads_or(int p) { return cudacpu::block_barrier_count(p) != 0; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { cudacpu::warp_collective(cudacpu::WARP_SYNC, mask, 0, 0, 32); }
static inline unsigned __activemask(void) { return cudacpu::active_mask(); }
static inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)cudacpu::warp_collective(cudacpu::WARP_BALLOT, mask, p != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int p) { return (int)cudacpu::warp_collective(cudacpu::WARP_ANY, mask, p != 0, 0, 32); }
static inline int __all_sync(unsigned mask, int p) { return (int)cudacpu::warp_collective(cudacpu::WARP_ALL, mask, p != 0, 0, 32); }

namespace cudacpu {
template <typename T>
static inline T shuffle(WarpOp op, unsigned mask, T v, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = warp_collective(op, mask, bits, arg, width);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
}  // namespace cudacpu
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return cudacpu::shuffle(cudacpu::WARP_SHFL, mask, v, src, width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cudacpu::shuffle(cudacpu::WARP_SHFL_UP, mask, v, (int)delta, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return cudacpu::shuffle(cudacpu::WARP_SHFL_DOWN, mask, v, (int)delta, width);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return cudacpu::shuffle(cudacpu::WARP_SHFL_XOR, mask, v, lane_mask, width);
}

static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline long long clock64(void) { return cudacpu::clock_cycles(); }
static inline void __nanosleep(unsigned ns) { (void)ns; }
template <typename T>
static inline T __ldg(const T* p) { return *p; }

// ---- atomics: real ones (a launch's blocks run on several workers at once) ---------------------
// Sequentially consistent, as the host's atomics; a float add is a compare-and-swap loop on
// its bits. Under the tools each reports itself (CUDA_CPU_ATOMIC_SEEN) and is not
// instrumented; the public functions are plain inline ones, so the report names the
// kernel's call site.
#define CUDA_CPU_ATOMIC CUDA_CPU_NOT_TRACED static inline
template <typename T>
CUDA_CPU_ATOMIC T cudacpu_atomic_update(T* p, T (*f)(T, T), T v) {
    CUDA_CPU_ATOMIC_SEEN(p);
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, f(old, v), false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename T>
CUDA_CPU_ATOMIC T cudacpu_atomic_fetch_add(T* p, T v) {
    CUDA_CPU_ATOMIC_SEEN(p);
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
CUDA_CPU_ATOMIC T cudacpu_atomic_exchange(T* p, T v) {
    CUDA_CPU_ATOMIC_SEEN(p);
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
CUDA_CPU_ATOMIC T cudacpu_atomic_cas(T* p, T cmp, T v) {
    CUDA_CPU_ATOMIC_SEEN(p);
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
// Floating-point adds through compare-and-swap on the bits (U: the same-sized integer).
template <typename F, typename U>
CUDA_CPU_ATOMIC F cudacpu_atomic_add_float(F* p, F v) {
    CUDA_CPU_ATOMIC_SEEN(p);
    U* u = (U*)p;
    U old = __atomic_load_n(u, __ATOMIC_RELAXED), next;
    F f;
    do {
        memcpy(&f, &old, sizeof(F));
        F sum = f + v;
        memcpy(&next, &sum, sizeof(F));
    } while (!__atomic_compare_exchange_n(u, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    memcpy(&f, &old, sizeof(F));
    return f;
}
static inline int atomicAdd(int* p, int v) { return cudacpu_atomic_fetch_add(p, v); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return cudacpu_atomic_fetch_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return cudacpu_atomic_fetch_add(p, v);
}
static inline float atomicAdd(float* p, float v) { return cudacpu_atomic_add_float<float, uint32_t>(p, v); }
static inline double atomicAdd(double* p, double v) { return cudacpu_atomic_add_float<double, uint64_t>(p, v); }
static inline int cudacpu_max_int(int a, int b) { return a > b ? a : b; }
static inline int cudacpu_min_int(int a, int b) { return a < b ? a : b; }
static inline unsigned cudacpu_max_uint(unsigned a, unsigned b) { return a > b ? a : b; }
static inline int atomicMax(int* p, int v) { return cudacpu_atomic_update(p, cudacpu_max_int, v); }
static inline int atomicMin(int* p, int v) { return cudacpu_atomic_update(p, cudacpu_min_int, v); }
static inline unsigned atomicMax(unsigned* p, unsigned v) { return cudacpu_atomic_update(p, cudacpu_max_uint, v); }
static inline int atomicExch(int* p, int v) { return cudacpu_atomic_exchange(p, v); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return cudacpu_atomic_exchange(p, v); }
static inline float atomicExch(float* p, float v) {
    unsigned u, old;
    float f;
    memcpy(&u, &v, 4);
    old = cudacpu_atomic_exchange((unsigned*)p, u);
    memcpy(&f, &old, 4);
    return f;
}
static inline int atomicCAS(int* p, int cmp, int v) { return cudacpu_atomic_cas(p, cmp, v); }
static inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { return cudacpu_atomic_cas(p, cmp, v); }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
    return cudacpu_atomic_cas(p, cmp, v);
}

// ---- intrinsics with exact host equivalents ---------------------------------------------
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
// The fast-math intrinsics are computed exactly here (documented: no approximations);
// __expf and __logf are glibc's own (declared by math.h), which are expf and logf.
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }

// CUDA's integer min and max overloads exist in host code too (the kernels use them).
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

// ---- GPU numerics (make ... CUDA_CPU_NUMERICS=gpu: cuda_cpu/nvcc, numerics.cpp) -------------
// Such builds define __CUDA_CPU_GPU_NUMERICS__ (and __CUDA_CPU_FAST_MATH__ where nvcc was given
// --use_fast_math); the math functions below then go through gpu_math, which in device code
// gives each the largest error CUDA documents for it. Host code keeps glibc's.
namespace cudacpu {
enum GpuMathFn { GPU_EXPF, GPU_LOGF, GPU_TANHF, GPU_SQRTF, GPU_RSQRTF, GPU_FAST_EXPF, GPU_FAST_LOGF, GPU_FAST_SQRTF,
                 GPU_FAST_TANHF, GPU_FAST_DIVIDEF };
float gpu_math(int fn, float x, float y, bool ftz);
void numerics_built(bool gpu);  // whether this translation unit has GPU numerics (runtime.cpp)
}  // namespace cudacpu
#ifdef __CUDA_CPU_GPU_NUMERICS__
#ifdef __CUDA_CPU_FAST_MATH__
#define CUDA_CPU_MATH_(precise, fast) fast  // --use_fast_math: expf is __expf, sqrtf and tanhf approximate
#else
#define CUDA_CPU_MATH_(precise, fast) precise
#endif
#define CUDA_CPU_MATH1_(name, fn) \
    static inline float name(float x) { return cudacpu::gpu_math(cudacpu::fn, x, 0.0f, CUDA_CPU_FTZ); }
CUDA_CPU_MATH1_(cudacpu_gpu_expf, CUDA_CPU_MATH_(GPU_EXPF, GPU_FAST_EXPF))
CUDA_CPU_MATH1_(cudacpu_gpu_logf, CUDA_CPU_MATH_(GPU_LOGF, GPU_FAST_LOGF))
CUDA_CPU_MATH1_(cudacpu_gpu_sqrtf, CUDA_CPU_MATH_(GPU_SQRTF, GPU_FAST_SQRTF))
CUDA_CPU_MATH1_(cudacpu_gpu_tanhf, CUDA_CPU_MATH_(GPU_TANHF, GPU_FAST_TANHF))
CUDA_CPU_MATH1_(cudacpu_gpu_rsqrtf, GPU_RSQRTF)
CUDA_CPU_MATH1_(cudacpu_gpu_fast_expf, GPU_FAST_EXPF)
CUDA_CPU_MATH1_(cudacpu_gpu_fast_logf, GPU_FAST_LOGF)
static inline float cudacpu_gpu_fdividef(float x, float y) {
    return cudacpu::gpu_math(cudacpu::GPU_FAST_DIVIDEF, x, y, CUDA_CPU_FTZ);
}
namespace std {
using ::cudacpu_gpu_expf;
using ::cudacpu_gpu_logf;
using ::cudacpu_gpu_sqrtf;
using ::cudacpu_gpu_tanhf;
}  // namespace std
#define expf(x) cudacpu_gpu_expf(x)
#define logf(x) cudacpu_gpu_logf(x)
#define sqrtf(x) cudacpu_gpu_sqrtf(x)
#define tanhf(x) cudacpu_gpu_tanhf(x)
#define rsqrtf(x) cudacpu_gpu_rsqrtf(x)
#define __expf(x) cudacpu_gpu_fast_expf(x)
#define __logf(x) cudacpu_gpu_fast_logf(x)
#define __fdividef(x, y) cudacpu_gpu_fdividef(x, y)
static const bool cudacpu_numerics_gpu = true;
#else
static const bool cudacpu_numerics_gpu = false;
#endif
// Each translation unit says which it has, so that a run asking for GPU numerics of a
// program built without them is refused (runtime.cpp).
static const int cudacpu_numerics_registered = (cudacpu::numerics_built(cudacpu_numerics_gpu), 0);

#endif
