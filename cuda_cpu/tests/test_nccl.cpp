/*
 * cuda_cpu/tests/test_nccl.cpp: unit test of the layer's NCCL (cuda_cpu/nccl.cpp).
 * MPI only broadcasts the unique id and provides the test's own barriers.
 *
 *   mpirun -np N test_nccl [basic]   N = 2, 3, 4: results against values computed here
 *   mpirun -np 2 test_nccl mismatch   ranks issue different collectives: exits 2 after the
 *                                     fault (stderr names both sides)
 *   mpirun -np 2 test_nccl inversion  two communicators issued in different orders: exits 2
 *   mpirun -np 2 test_nccl abort      ncclCommAbort while a peer never arrives
 *   mpirun -np 2 test_nccl order      two communicators in the same order, one rank slow
 *   CUDA_CPU_SHARED_GPU=1 mpirun -np 2 test_nccl shared_gpu
 *   CUDA_CPU_NCCL_CONCURRENT=1 mpirun -np 2 test_nccl concurrent   two communicators on one
 *                                     stream pass; on two streams, one launched while the
 *                                     other's waits for its peer: a fault, exits 2
 *   test_nccl dead | stopped          without mpirun: a forked peer exits / is stopped
 *   CUDA_CPU_NCCL_PEERS=local test_nccl peers_local   without mpirun: a forked peer's exit
 *                                     unseen, destroy waits for every rank
 * Prints TAP (tests/tap.h) from rank 0, the other ranks' failed checks on stderr; exit 1 on a
 * failed check.
 */
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>

#include "cuda_cpu/internal.h"  // exact bf16 conversions
#include "cuda_cpu/tests/tap.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static int g_rank = 0, g_size = 1, g_failed = 0;
static bool g_mpi = false;

static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static std::string fmt(const char* f, ...) {
    char b[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(b, sizeof(b), f, ap);
    va_end(ap);
    return b;
}

// This rank's check, printed by this rank.
static void check_mine(bool ok, const std::string& what) {
    tap_ok(ok, "[rank %d] %s", g_rank, what.c_str());
    if (!ok) g_failed++;
}

// A check every rank makes: one line, from rank 0, passing where it passes everywhere.
static void check_all(bool ok, const std::string& what) {
    int mine = ok, all = ok;
    if (g_mpi) MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) fprintf(stderr, "[rank %d] failed here: %s\n", g_rank, what.c_str());
    tap_ok(all, "%s (%d ranks)", what.c_str(), g_size);
    if (!all) g_failed++;
}

static bool contains(const char* s, const char* part) { return s && strstr(s, part); }

static void barrier() {
    if (g_mpi) MPI_Barrier(MPI_COMM_WORLD);
}

static ncclComm_t make_comm(size_t stage_bytes = 0) {
    ncclUniqueId id;
    if (g_rank == 0) {
        if (stage_bytes) setenv("CUDA_CPU_NCCL_STAGE_BYTES", std::to_string(stage_bytes).c_str(), 1);
        if (ncclGetUniqueId(&id) != ncclSuccess) abort();
        unsetenv("CUDA_CPU_NCCL_STAGE_BYTES");
    }
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRank(&c, g_size, id, g_rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "[rank %d] ncclCommInitRank: %s: %s\n", g_rank, ncclGetErrorString(r),
                ncclGetLastError(nullptr));
        exit(1);
    }
    return c;
}

// ---- device buffers -----------------------------------------------------------------------
template <class T>
static T* to_dev(const std::vector<T>& h) {
    void* d = nullptr;
    if (cudaMalloc(&d, h.size() * sizeof(T) + 1) != cudaSuccess) abort();
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return (T*)d;
}

template <class T>
static std::vector<T> from_dev(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}

template <class T>
static bool same(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- element types: values, and the sum in rank order with NCCL's rounding per step -----------
struct bf16 {
    uint16_t bits;
};

template <class T>
struct Ty;
template <>
struct Ty<float> {
    static constexpr ncclDataType_t type = ncclFloat;
    static constexpr const char* name = "float";
    static float make(int r, size_t i) { return (float)(r + 1) * 0.37f + (float)(i % 97) * 0.013f - 1.1f; }
    static float add(float a, float b) { return a + b; }
    static float premul(float a, int n) { return a * (float)(1.0 / n); }
};
template <>
struct Ty<double> {
    static constexpr ncclDataType_t type = ncclDouble;
    static constexpr const char* name = "double";
    static double make(int r, size_t i) { return (double)(r + 1) * 0.37 + (double)(i % 89) * 0.0131 - 1.1; }
    static double add(double a, double b) { return a + b; }
    static double premul(double a, int n) { return a * (double)(float)(1.0 / n); }
};
template <>
struct Ty<int32_t> {
    static constexpr ncclDataType_t type = ncclInt32;
    static constexpr const char* name = "int32";
    static int32_t make(int r, size_t i) { return (int32_t)((r * 1000003 + i * 7919) % 20001) - 10000; }
    static int32_t add(int32_t a, int32_t b) { return a + b; }
    static int32_t avg(int32_t a, int n) { return a / n; }
};
template <>
struct Ty<bf16> {
    static constexpr ncclDataType_t type = ncclBfloat16;
    static constexpr const char* name = "bf16";
    static float f(bf16 v) { return cudacpu::bf16_bits_to_float(v.bits); }
    static bf16 b(float x) { return bf16{cudacpu::float_to_bf16_bits(x)}; }
    static bf16 make(int r, size_t i) { return b(Ty<float>::make(r, i) * 3.3f); }
    static bf16 add(bf16 a, bf16 c) { return b(f(a) + f(c)); }
    static bf16 premul(bf16 a, int n) { return b(f(a) * f(b((float)(1.0 / n)))); }
};

// Element i of the sum (or ncclAvg) of every rank's send. ncclAvg as real NCCL computes it
// (src/enqueue.cc hostToDevRedOp, src/device/reduce_kernel.h FuncPreMulSum): for floating
// types each input times float(1.0/nranks) rounded to the type, then summed; for integers
// the sum divided by nranks.
template <class T>
static T expected_sum(int idx_rank_base, size_t i, bool avg = false) {
    (void)idx_rank_base;
    auto input = [&](int q) {
        if constexpr (std::is_integral_v<T>) return Ty<T>::make(q, i);
        else return avg ? Ty<T>::premul(Ty<T>::make(q, i), g_size) : Ty<T>::make(q, i);
    };
    T a = input(0);
    for (int q = 1; q < g_size; q++) a = Ty<T>::add(a, input(q));
    if constexpr (std::is_integral_v<T>) return avg ? Ty<T>::avg(a, g_size) : a;
    else return a;
}

template <class T>
static std::vector<T> values(int r, size_t n) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; i++) v[i] = Ty<T>::make(r, i);
    return v;
}

template <class T>
static void test_all_reduce(ncclComm_t comm, cudaStream_t s, size_t n, const std::string& tag, bool in_place,
                            ncclRedOp_t op) {
    std::vector<T> want(n);
    for (size_t i = 0; i < n; i++) want[i] = expected_sum<T>(0, i, op == ncclAvg);
    T* send = to_dev(values<T>(g_rank, n));
    T* recv = in_place ? send : to_dev(std::vector<T>(n));
    ncclResult_t r = ncclAllReduce(send, recv, n, Ty<T>::type, op, comm, s);
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(recv, n), want),
              fmt("all-reduce %s %s of %zu %s %s", op == ncclAvg ? "avg" : "sum",
                  in_place ? "in place" : "out of place", n, Ty<T>::name, tag.c_str()));
    cudaFree(send);
    if (!in_place) cudaFree(recv);
}

template <class T>
static void test_reduce_scatter(ncclComm_t comm, cudaStream_t s, size_t rc, const std::string& tag, bool in_place) {
    size_t n = rc * g_size;
    std::vector<T> want(rc);
    for (size_t i = 0; i < rc; i++) want[i] = expected_sum<T>(0, g_rank * rc + i);
    T* send = to_dev(values<T>(g_rank, n));
    T* recv = in_place ? send + g_rank * rc : to_dev(std::vector<T>(rc));
    ncclResult_t r = ncclReduceScatter(send, recv, rc, Ty<T>::type, ncclSum, comm, s);
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(recv, rc), want),
              fmt("reduce-scatter sum %s of %zu %s per rank %s", in_place ? "in place" : "out of place", rc,
                  Ty<T>::name, tag.c_str()));
    cudaFree(send);
    if (!in_place) cudaFree(recv);
}

template <class T>
static void test_all_gather(ncclComm_t comm, cudaStream_t s, size_t sc, const std::string& tag, bool in_place) {
    size_t n = sc * g_size;
    std::vector<T> want(n), mine = values<T>(g_rank, sc), start(n);
    for (int q = 0; q < g_size; q++)
        for (size_t i = 0; i < sc; i++) want[q * sc + i] = Ty<T>::make(q, i);
    for (size_t i = 0; i < sc; i++) start[g_rank * sc + i] = mine[i];
    T* recv = to_dev(start);
    T* send = in_place ? recv + g_rank * sc : to_dev(mine);
    ncclResult_t r = ncclAllGather(send, recv, sc, Ty<T>::type, comm, s);
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(recv, n), want),
              fmt("all-gather %s of %zu %s per rank %s", in_place ? "in place" : "out of place", sc, Ty<T>::name,
                  tag.c_str()));
    cudaFree(recv);
    if (!in_place) cudaFree(send);
}

template <class T>
static void test_broadcast(ncclComm_t comm, cudaStream_t s, size_t n, const std::string& tag, bool in_place) {
    int root = in_place ? 0 : g_size - 1;
    std::vector<T> want = values<T>(root, n);
    T* send = to_dev(g_rank == root ? want : std::vector<T>(n));
    T* recv = in_place ? send : to_dev(std::vector<T>(n));
    ncclResult_t r = ncclBroadcast(send, recv, n, Ty<T>::type, root, comm, s);
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(recv, n), want),
              fmt("broadcast from root %d %s of %zu %s %s", root, in_place ? "in place" : "out of place", n,
                  Ty<T>::name, tag.c_str()));
    cudaFree(send);
    if (!in_place) cudaFree(recv);
}

template <class T>
static void test_type(ncclComm_t comm, cudaStream_t s, size_t n, const std::string& tag) {
    for (int in_place = 0; in_place < 2; in_place++) {
        test_all_reduce<T>(comm, s, n, tag, in_place, ncclSum);
        test_reduce_scatter<T>(comm, s, n / 2, tag, in_place);
        test_all_gather<T>(comm, s, n / 3, tag, in_place);
        test_broadcast<T>(comm, s, n, tag, in_place);
    }
}

// ---- other reductions and types ---------------------------------------------------------------
static void test_more_ops(ncclComm_t comm, cudaStream_t s) {
    test_all_reduce<float>(comm, s, 777, "", false, ncclAvg);
    test_all_reduce<bf16>(comm, s, 777, "", true, ncclAvg);
    test_all_reduce<int32_t>(comm, s, 100, "", false, ncclAvg);
    const size_t n = 64;
    std::vector<int32_t> mine(n), mx(n), mn(n), pr(n);
    for (size_t i = 0; i < n; i++) {
        for (int q = 0; q < g_size; q++) {
            int32_t v = (int32_t)((q * 37 + i * 11) % 23) - 11;
            if (q == g_rank) mine[i] = v;
            mx[i] = q ? std::max(mx[i], v) : v;
            mn[i] = q ? std::min(mn[i], v) : v;
            pr[i] = q ? pr[i] * v : v;
        }
    }
    ncclRedOp_t ops[3] = {ncclMax, ncclMin, ncclProd};
    const std::vector<int32_t>* wants[3] = {&mx, &mn, &pr};
    for (int k = 0; k < 3; k++) {
        int32_t* b = to_dev(mine);
        ncclResult_t r = ncclAllReduce(b, b, n, ncclInt32, ops[k], comm, s);
        cudaStreamSynchronize(s);
        check_all(r == ncclSuccess && same(from_dev(b, n), *wants[k]),
                  fmt("all-reduce %s of int32", k == 0   ? "max"
                                                : k == 1 ? "min"
                                                         : "prod"));
        cudaFree(b);
    }
    // int64 sum, uint8 sum wrapping, half sum of exact values, ncclReduce to a root.
    std::vector<int64_t> l(n), lw(n, 0);
    std::vector<uint8_t> u(n), uw(n, 0);
    std::vector<uint16_t> h(n), hw(n);
    for (size_t i = 0; i < n; i++) {
        l[i] = ((int64_t)1 << 40) * (g_rank + 1) + (int64_t)i;
        u[i] = (uint8_t)(200 + g_rank + i);
        h[i] = (uint16_t)(0x3c00 + (g_rank << 8));  // 1.0, 1.25, 1.5, 1.75: exact sums
        float hs = 0;
        for (int q = 0; q < g_size; q++) {
            lw[i] += ((int64_t)1 << 40) * (q + 1) + (int64_t)i;
            uw[i] = (uint8_t)(uw[i] + 200 + q + i);
            hs += 1.0f + 0.25f * q;
        }
        hw[i] = hs == 2.25f ? 0x4080 : hs == 3.75f ? 0x4380 : hs == 5.5f ? 0x4580 : 0x3c00;  // 2, 3 or 4 ranks
    }
    int64_t* dl = to_dev(l);
    uint8_t* du = to_dev(u);
    uint16_t* dh = to_dev(h);
    uint16_t* dr = to_dev(std::vector<uint16_t>(n));
    int root = 1 % g_size;
    bool ok = ncclAllReduce(dl, dl, n, ncclInt64, ncclSum, comm, s) == ncclSuccess &&
              ncclAllReduce(du, du, n, ncclUint8, ncclSum, comm, s) == ncclSuccess &&
              ncclReduce(dh, g_rank == root ? dr : nullptr, n, ncclFloat16, ncclSum, root, comm, s) == ncclSuccess;
    cudaStreamSynchronize(s);
    check_all(ok && same(from_dev(dl, n), lw) && same(from_dev(du, n), uw),
              "all-reduce sum of int64 and of uint8 (wrapping)");
    check_all(ok && (g_rank != root || same(from_dev(dr, n), hw)), fmt("reduce sum of half to root %d", root));
    cudaFree(dl);
    cudaFree(du);
    cudaFree(dh);
    cudaFree(dr);
}

// ---- groups and send/recv ------------------------------------------------------------------------
static void test_groups(ncclComm_t comm, cudaStream_t s) {
    // train_gpt2.cu's rep_finish_import: each root broadcasts its slice in place, one group.
    const size_t n = 1000;
    std::vector<float> want(n), start(n, -1.0f);
    for (size_t i = 0; i < n; i++) {
        int owner = (int)(i * g_size / n);
        want[i] = Ty<float>::make(owner, i);
        if (owner == g_rank) start[i] = want[i];
    }
    float* b = to_dev(start);
    ncclResult_t r = ncclGroupStart();
    for (int root = 0; root < g_size; root++) {
        size_t lo = (root * n + g_size - 1) / g_size, hi = ((root + 1) * n + g_size - 1) / g_size;
        if (ncclBroadcast(b + lo, b + lo, hi - lo, ncclFloat, root, comm, s) != ncclSuccess) r = ncclInternalError;
    }
    if (ncclGroupEnd() != ncclSuccess) r = ncclInternalError;
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(b, n), want), "group of in-place broadcasts, one per root");
    cudaFree(b);

    // Reduce-scatter then all-gather in one (nested) group, as zero1 does per bucket.
    size_t rc = 300;
    std::vector<float> sums(rc * g_size);
    for (size_t i = 0; i < sums.size(); i++) sums[i] = expected_sum<float>(0, i);
    float* g = to_dev(values<float>(g_rank, rc * g_size));
    float* p = to_dev(values<float>(g_rank, rc * g_size));
    r = ncclGroupStart();
    ncclGroupStart();
    ncclReduceScatter(g, g + g_rank * rc, rc, ncclFloat, ncclSum, comm, s);
    ncclGroupEnd();  // inner end: nothing launched yet
    ncclAllGather(p + g_rank * rc, p, rc, ncclFloat, comm, s);
    if (ncclGroupEnd() != ncclSuccess) r = ncclInternalError;
    cudaStreamSynchronize(s);
    std::vector<float> gs = from_dev(g + g_rank * rc, rc), ps = from_dev(p, rc * g_size), want_ps(rc * g_size);
    for (int q = 0; q < g_size; q++)
        for (size_t i = 0; i < rc; i++) want_ps[q * rc + i] = Ty<float>::make(q, q * rc + i);
    check_all(r == ncclSuccess &&
                  same(gs, std::vector<float>(sums.begin() + g_rank * rc, sums.begin() + (g_rank + 1) * rc)) &&
                  same(ps, want_ps),
              "nested group: in-place reduce-scatter and all-gather");
    cudaFree(g);
    cudaFree(p);
}

static void test_send_recv(ncclComm_t comm, cudaStream_t s, size_t n, const std::string& tag) {
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    float* out = to_dev(values<float>(g_rank, n));
    float* in = to_dev(std::vector<float>(n));
    ncclGroupStart();
    ncclSend(out, n, ncclFloat, next, comm, s);
    ncclRecv(in, n, ncclFloat, prev, comm, s);
    ncclResult_t r = ncclGroupEnd();
    cudaStreamSynchronize(s);
    check_all(r == ncclSuccess && same(from_dev(in, n), values<float>(prev, n)),
              fmt("send/recv ring in a group, %zu floats %s", n, tag.c_str()));
    // Both directions with one peer in one group (receive first on odd ranks).
    int peer = g_rank ^ 1;
    bool paired = peer < g_size;
    if (paired) {
        ncclGroupStart();
        if (g_rank & 1) ncclRecv(in, n, ncclFloat, peer, comm, s);
        ncclSend(out, n, ncclFloat, peer, comm, s);
        if (!(g_rank & 1)) ncclRecv(in, n, ncclFloat, peer, comm, s);
        r = ncclGroupEnd();
        cudaStreamSynchronize(s);
    }
    check_all(!paired || (r == ncclSuccess && same(from_dev(in, n), values<float>(peer, n))),
              fmt("send to and receive from the same peer in one group %s", tag.c_str()));
    cudaFree(out);
    cudaFree(in);
}

// ---- refused calls ------------------------------------------------------------------------------------
static void test_refusals(ncclComm_t comm, cudaStream_t s) {
    const size_t rc = 16;
    float* b = to_dev(std::vector<float>(rc * g_size));
    int wrong = (g_rank + 1) % g_size;
    ncclResult_t r = ncclReduceScatter(b, b + wrong * rc, rc, ncclFloat, ncclSum, comm, s);
    const char* e = ncclGetLastError(comm);
    check_all(
        r == ncclInvalidArgument && contains(e, "ncclReduceScatter") &&
            contains(e, fmt("expected %zu bytes", g_rank * rc * 4).c_str()) &&
            contains(e, fmt("is %zd bytes", (ssize_t)(wrong * rc * 4)).c_str()),
        "reduce-scatter with recvbuff at the wrong in-place offset: ncclInvalidArgument, expected and actual offset");
    r = ncclAllGather(b + wrong * rc, b, rc, ncclFloat, comm, s);
    check_all(r == ncclInvalidArgument && contains(ncclGetLastError(nullptr), "ncclAllGather") &&
                  contains(ncclGetLastError(nullptr), "sendbuff == recvbuff + rank*sendcount"),
              "all-gather with sendbuff at the wrong in-place offset: ncclInvalidArgument");
    r = ncclAllReduce(b, b + 1, 8, ncclFloat, ncclSum, comm, s);
    check_all(r == ncclInvalidArgument && contains(ncclGetLastError(nullptr), "ncclAllReduce"),
              "overlapping all-reduce buffers: ncclInvalidArgument");
    std::vector<float> host(8);
    r = ncclAllReduce(host.data(), host.data(), 8, ncclFloat, ncclSum, comm, s);
    check_all(r == ncclInvalidArgument, "host (not device) buffer: ncclInvalidArgument");
    r = ncclAllReduce(b, b, 1 + rc * g_size, ncclFloat, ncclSum, comm, s);
    check_all(r == ncclInvalidArgument, "count past the end of the allocation: ncclInvalidArgument");
    check_all(ncclAllReduce(b, b, 8, ncclFloat8e4m3, ncclSum, comm, s) == ncclInvalidArgument &&
                  ncclAllReduce(b, b, 8, ncclFloat, ncclNumOps, comm, s) == ncclInvalidArgument &&
                  ncclBroadcast(b, b, 8, ncclFloat, g_size, comm, s) == ncclInvalidArgument &&
                  ncclSend(b, 8, ncclFloat, -1, comm, s) == ncclInvalidArgument,
              "fp8, an unknown reduction, a root or a peer out of range: ncclInvalidArgument");
    check_all(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart: ncclInvalidUsage");
    // A group with a refused call launches nothing; the next collective still matches.
    ncclGroupStart();
    ncclAllReduce(b, b, 8, ncclFloat, ncclSum, comm, s);
    ncclReduceScatter(b, b + wrong * rc, rc, ncclFloat, ncclSum, comm, s);
    r = ncclGroupEnd();
    check_all(r == ncclInvalidArgument, "ncclGroupEnd of a group with a refused call returns its error");
    check_all(ncclAllReduce(b, b, 0, ncclFloat, ncclSum, comm, s) == ncclSuccess &&
                  ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, s) == ncclSuccess,
              "count 0: a no-op");
    test_all_reduce<float>(comm, s, 50, "after the refused calls", false, ncclSum);
    ncclResult_t async = ncclInternalError;
    check_all(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess,
              "no async error after all that");
    cudaFree(b);

    ncclComm_t gone = make_comm();
    check_all(ncclCommDestroy(gone) == ncclSuccess, "ncclCommDestroy");
    r = ncclAllReduce(b, b, 8, ncclFloat, ncclSum, gone, s);
    check_all(r == ncclInvalidArgument && contains(ncclGetLastError(nullptr), "destroyed"),
              "a call on a destroyed communicator: ncclInvalidArgument");
}

// Each rank alone in a communicator of its own (zero1's one-rank NCCL tests do this).
static void test_one_rank(cudaStream_t s) {
    ncclUniqueId id;
    ncclComm_t one = nullptr;
    bool ok = ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&one, 1, id, 0) == ncclSuccess;
    std::vector<float> v = values<float>(g_rank, 300);
    float* b = to_dev(v);
    float* g = to_dev(std::vector<float>(300));
    ok = ok && ncclAllReduce(b, b, 300, ncclFloat, ncclAvg, one, s) == ncclSuccess &&
         ncclReduceScatter(b, b, 300, ncclFloat, ncclSum, one, s) == ncclSuccess &&
         ncclAllGather(b, g, 300, ncclFloat, one, s) == ncclSuccess;
    cudaStreamSynchronize(s);
    check_all(ok && same(from_dev(b, 300), v) && same(from_dev(g, 300), v) && ncclCommDestroy(one) == ncclSuccess,
              "a one-rank communicator: all-reduce avg, reduce-scatter, all-gather are copies");
    cudaFree(b);
    cudaFree(g);
}

static void test_basic() {
    ncclComm_t comm = make_comm(), small = make_comm(4096);  // small: many chunks, small buffers
    int v = 0, count = 0, rank = -1, dev = -1;
    check_all(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE &&
                  ncclCommCount(comm, &count) == ncclSuccess && count == g_size &&
                  ncclCommUserRank(comm, &rank) == ncclSuccess && rank == g_rank &&
                  ncclCommCuDevice(comm, &dev) == ncclSuccess && dev == 0,
              "version, count, rank, device");
    cudaStream_t s, s2;
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    test_type<float>(comm, s, 1200, "");
    test_type<bf16>(comm, s, 1200, "");
    test_type<double>(comm, s, 600, "");
    test_type<int32_t>(comm, s, 600, "");
    test_type<float>(small, s, 5000, "(4 KiB staging)");
    test_type<bf16>(small, s2, 5000, "(4 KiB staging)");
    test_more_ops(comm, s);
    test_groups(comm, s);
    test_groups(small, s2);
    test_send_recv(comm, s, 3000, "");
    test_send_recv(small, s2, 3000, "(4 KiB staging, several chunks)");
    test_refusals(comm, s);
    test_one_rank(s);
    check_all(ncclCommDestroy(comm) == ncclSuccess && ncclCommDestroy(small) == ncclSuccess,
              "destroy both communicators");
}

// ---- the order of the sums (CUDA_CPU_NCCL_ORDER) -------------------------------------------------
// Inputs whose float sum tells the order: A = 2^24, where A + 1 rounds back to A (fp32's
// spacing there is 2, the tie goes to even). 3 ranks x = {A, 1, 1}; 4 ranks {A, 1, 1, -A}.
// The expected results, by hand from NCCL's algorithms (docs: src/device/all_reduce.h and
// reduce_scatter.h runRing: the piece ending on rank l starts on l+1 and adds l's own last;
// src/graph/trees.cc ncclGetBtree: root 0 with child 2, whose children are 1 then 3):
//   rank   3: (A+1)+1 = A                 4: ((A+1)+1)-A = 0
//   ring   3: piece ending on 0: (1+1)+A = A+2; on 1: (1+A)+1 = A; on 2: (A+1)+1 = A
//          4: on 0: ((1+1)-A)+A = 2; on 1: ((1-A)+A)+1 = 2; on 2: ((-A+A)+1)+1 = 2;
//             on 3: ((A+1)+1)-A = 0
//   tree   3: A+(1+1) = A+2            4: A+((1+1)-A) = 2   (all-reduce only; the rest ring)
// An all-reduce of 16 floats: pieces of 6 (3 ranks: ceil(16/3) rounded up to 16 bytes) or 4
// (4 ranks); a reduce-scatter: each rank's block ends on it; a reduce: on its root.
static const float kA = 16777216.0f;
static float order_input(int r) { return r == 0 ? kA : r == 3 ? -kA : 1.0f; }
static float expect_order(const std::string& order, int last, bool all_reduce) {
    const float a2 = kA + 2.0f;
    if (order == "rank") return g_size == 3 ? kA : 0.0f;
    if (order == "tree" && all_reduce) return g_size == 3 ? a2 : 2.0f;
    if (g_size == 3) return last == 0 ? a2 : kA;  // ring
    return last == 3 ? 0.0f : 2.0f;
}

static int test_orders(const std::string& order) {
    ncclComm_t comm = make_comm();
    cudaStream_t s;
    cudaStreamCreate(&s);
    const size_t n = 16;
    float* b = to_dev(std::vector<float>(n, order_input(g_rank)));
    bool ok = ncclAllReduce(b, b, n, ncclFloat, ncclSum, comm, s) == ncclSuccess;
    cudaStreamSynchronize(s);
    std::vector<float> got = from_dev(b, n), want(n);
    const size_t piece = g_size == 3 ? 8 : 4;  // ceil(16/3) = 6 rounded up to 16 bytes (4 floats): 8
    for (size_t i = 0; i < n; i++) want[i] = expect_order(order, (int)(i / piece), true);
    if (order == "random") {
        // All ranks get the same bits (NCCL's guarantee); every value one of the chain orders'
        // (3 ranks: A or A+2; 4: 0, 1 or 2); over 20 calls the order changes.
        std::vector<float> all(n * g_size);
        MPI_Allgather(got.data(), (int)n, MPI_FLOAT, all.data(), (int)n, MPI_FLOAT, MPI_COMM_WORLD);
        bool same_all = true, in_set = true;
        for (int q = 0; q < g_size; q++) same_all &= memcmp(all.data() + q * n, got.data(), n * sizeof(float)) == 0;
        std::vector<float> seen;
        for (int call = 0; call < 20; call++) {
            float* c = to_dev(std::vector<float>(n, order_input(g_rank)));
            ok &= ncclAllReduce(c, c, n, ncclFloat, ncclSum, comm, s) == ncclSuccess;
            cudaStreamSynchronize(s);
            std::vector<float> r = from_dev(c, n);
            MPI_Allgather(r.data(), (int)n, MPI_FLOAT, all.data(), (int)n, MPI_FLOAT, MPI_COMM_WORLD);
            for (int q = 0; q < g_size; q++) same_all &= memcmp(all.data() + q * n, r.data(), n * sizeof(float)) == 0;
            for (float v : r) {
                in_set &= g_size == 3 ? (v == kA || v == kA + 2.0f) : (v == 0.0f || v == 1.0f || v == 2.0f);
                if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
            }
            cudaFree(c);
        }
        check_all(ok && same_all, "random order: every rank gets the same bits, 21 all-reduces");
        check_all(in_set, "random order: every result is a chain order's sum");
        check_all(seen.size() >= 2, fmt("random order: the order changes between calls (%zu results seen)", seen.size()));
    } else {
        check_all(ok && same(got, want), fmt("%s order: all-reduce of 16 floats, piece by piece", order.c_str()));
    }
    // Reduce-scatter: this rank's block ends on it (tree: NCCL has rings only).
    float* rs = to_dev(std::vector<float>(4 * g_size, order_input(g_rank)));
    ok = ncclReduceScatter(rs, rs + 4 * g_rank, 4, ncclFloat, ncclSum, comm, s) == ncclSuccess;
    cudaStreamSynchronize(s);
    std::vector<float> mine = from_dev(rs + 4 * g_rank, 4);
    if (order != "random") {
        check_all(ok && same(mine, std::vector<float>(4, expect_order(order, g_rank, false))),
                  fmt("%s order: reduce-scatter, each block ending on its rank", order.c_str()));
        // Reduce to root 0: the ring ends on the root.
        float* rd = to_dev(std::vector<float>(n, order_input(g_rank)));
        float* out = to_dev(std::vector<float>(n));
        ok = ncclReduce(rd, out, n, ncclFloat, ncclSum, 0, comm, s) == ncclSuccess;
        cudaStreamSynchronize(s);
        check_all(ok && (g_rank != 0 || same(from_dev(out, n), std::vector<float>(n, expect_order(order, 0, false)))),
                  fmt("%s order: reduce to root 0, ending on it", order.c_str()));
        // bf16, rounded after each addition: 256 + 1 = 257 ties to 256 (spacing 2); the inputs
        // {256, 1, 1} (3 ranks) give the fp32 case's pattern at 256 instead of A.
        if (g_size == 3) {
            uint16_t in = g_rank == 0 ? 0x4380 : 0x3F80;  // 256, 1
            uint16_t* h = to_dev(std::vector<uint16_t>(n, in));
            ok = ncclAllReduce(h, h, n, ncclBfloat16, ncclSum, comm, s) == ncclSuccess;
            cudaStreamSynchronize(s);
            std::vector<uint16_t> hw(n);
            for (size_t i = 0; i < n; i++) {  // 16 bf16 = 32 bytes: ceil(16/3) = 6 -> 8 per piece
                float e = expect_order(order, (int)(i / 8), true);
                hw[i] = e == kA + 2.0f ? 0x4381 : 0x4380;  // 258 or 256
            }
            check_all(ok && same(from_dev(h, n), hw), fmt("%s order: all-reduce of bf16, per-step rounding",
                                                          order.c_str()));
            cudaFree(h);
        }
        cudaFree(rd);
        cudaFree(out);
    }
    cudaFree(rs);
    cudaFree(b);
    ncclCommDestroy(comm);
    return g_failed ? 1 : 0;
}

// ---- the failing modes ---------------------------------------------------------------------------------
// Rank 0 a reduce-scatter of 4096 floats, rank 1 an all-gather of 2048 bf16: a fault, no hang.
static int test_mismatch() {
    ncclComm_t comm = make_comm();
    cudaStream_t s;
    cudaStreamCreate(&s);
    float* b = to_dev(std::vector<float>(4096 * 2));
    double t0 = now_s();
    ncclResult_t r = g_rank == 0 ? ncclReduceScatter(b, b, 4096, ncclFloat, ncclSum, comm, s)
                                 : ncclAllGather((uint16_t*)b + 2048, b, 2048, ncclBfloat16, comm, s);  // in place
    cudaError_t e = cudaStreamSynchronize(s);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const char* text = ncclGetLastError(comm);
    check_mine(r == ncclSuccess && e != cudaSuccess && async == ncclInvalidUsage && now_s() - t0 < 20,
               fmt("mismatched collectives: the stream fails (%s), async error %s", cudaGetErrorString(e),
                   ncclGetErrorString(async)));
    check_mine(
        contains(text,
                 "rank 0 issued ncclReduceScatter of 4096 float sum, rank 1 issued ncclAllGather of 2048 bfloat16"),
        fmt("the error names both sides: %s", text));
    check_mine(ncclAllReduce(b, b, 8, ncclFloat, ncclSum, comm, s) == ncclInvalidUsage,
               "later calls on the communicator fail");
    barrier();
    return g_failed ? 1 : 2;
}

// Rank 0 issues on A then B, rank 1 on B then A: each waits for the other, forever on a GPU.
static int test_inversion() {
    ncclComm_t a = make_comm(), b = make_comm();
    cudaStream_t sa, sb;
    cudaStreamCreate(&sa);
    cudaStreamCreate(&sb);
    float* x = to_dev(std::vector<float>(1024, 1.0f));
    float* y = to_dev(std::vector<float>(1024, 1.0f));
    double t0 = now_s();
    if (g_rank == 0) {
        ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, a, sa);
        ncclAllReduce(y, y, 512, ncclFloat, ncclSum, b, sb);
    } else {
        ncclAllReduce(y, y, 512, ncclFloat, ncclSum, b, sb);
        ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, a, sa);
    }
    cudaError_t ea = cudaStreamSynchronize(sa), eb = cudaStreamSynchronize(sb);
    double took = now_s() - t0;
    ncclResult_t aa = ncclSuccess, ab = ncclSuccess;
    ncclCommGetAsyncError(a, &aa);
    ncclCommGetAsyncError(b, &ab);
    // The detecting rank's async error is ncclInvalidUsage (its last error may be a later one).
    int saw = contains(ncclGetLastError(a), "different orders") || contains(ncclGetLastError(b), "different orders") ||
              aa == ncclInvalidUsage || ab == ncclInvalidUsage,
        any = saw;
    MPI_Allreduce(&saw, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    check_mine(took < 20 && (aa != ncclSuccess || ab != ncclSuccess),
               fmt("both streams return (%.1f s; %s, %s); async errors %s / %s", took, cudaGetErrorString(ea),
                   cudaGetErrorString(eb), ncclGetErrorString(aa), ncclGetErrorString(ab)));
    check_mine(any, "a rank reported the order inversion");
    barrier();
    return g_failed ? 1 : 2;
}

// Rank 0's op waits for a rank 1 that never comes, then rank 0 aborts; the reverse on a
// second communicator. Waiting ops return; the survivor sees ncclRemoteError.
static int test_abort() {
    ncclComm_t c = make_comm(), d = make_comm();
    cudaStream_t s;
    cudaStreamCreate(&s);
    float* x = to_dev(std::vector<float>(256, 1.0f));
    if (g_rank == 0) {
        ncclAllReduce(x, x, 256, ncclFloat, ncclSum, c, s);
        usleep(300 * 1000);
        double t0 = now_s();
        ncclResult_t r = ncclCommAbort(c);
        double t1 = now_s();
        cudaStreamSynchronize(s);
        check_mine(r == ncclSuccess && t1 - t0 < 0.5 && now_s() - t0 < 2,
                   fmt("abort returns at once (%.3f s), the waiting op returns (%.3f s)", t1 - t0, now_s() - t0));
        check_mine(ncclAllReduce(x, x, 256, ncclFloat, ncclSum, c, s) == ncclInvalidArgument,
                   "a call after abort: ncclInvalidArgument");
        barrier();
        barrier();
        usleep(300 * 1000);  // rank 1 waits in its op on d meanwhile
        check_mine(ncclCommAbort(d) == ncclSuccess, "abort the second communicator while rank 1 waits");
    } else {
        barrier();  // rank 0 has aborted c
        double t0 = now_s();
        ncclResult_t r = ncclAllReduce(x, x, 256, ncclFloat, ncclSum, c, s);
        cudaStreamSynchronize(s);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(c, &async);
        check_mine(r == ncclSuccess && async == ncclRemoteError && contains(ncclGetLastError(c), "aborted") &&
                       now_s() - t0 < 2,
                   fmt("an op on a communicator a peer aborted returns; async error %s: %s", ncclGetErrorString(async),
                       ncclGetLastError(c)));
        barrier();
        t0 = now_s();
        ncclAllReduce(x, x, 256, ncclFloat, ncclSum, d, s);
        cudaStreamSynchronize(s);
        async = ncclSuccess;
        ncclCommGetAsyncError(d, &async);
        check_mine(async == ncclRemoteError && now_s() - t0 < 3,
                   fmt("an op waiting when its peer aborts returns (%.2f s); async error %s", now_s() - t0,
                       ncclGetErrorString(async)));
        check_mine(ncclCommDestroy(c) == ncclSuccess && ncclCommDestroy(d) == ncclSuccess,
                   "destroy after the peer's abort");
    }
    barrier();
    return g_failed ? 1 : 0;
}

// Two communicators of this device, two streams, and two buffers of this rank's 1000 values.
struct TwoComms {
    ncclComm_t a, b;
    cudaStream_t sa, sb;
    float *x, *y;
    std::vector<float> want;  // every rank's values summed
};
static TwoComms two_comms() {
    TwoComms t;
    t.a = make_comm();
    t.b = make_comm();
    cudaStreamCreate(&t.sa);
    cudaStreamCreate(&t.sb);
    t.x = to_dev(values<float>(g_rank, 1000));
    t.y = to_dev(values<float>(g_rank, 1000));
    for (size_t i = 0; i < 1000; i++) t.want.push_back(expected_sum<float>(0, i));
    return t;
}

// Same order on two communicators with rank 1 late: waiting, not an inversion.
static int test_order() {
    TwoComms t = two_comms();
    ncclComm_t a = t.a, b = t.b;
    float *x = t.x, *y = t.y;
    const std::vector<float>& want = t.want;
    if (g_rank == 1) usleep(2600 * 1000);
    ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, a, t.sa);
    ncclAllReduce(y, y, 1000, ncclFloat, ncclSum, b, t.sb);
    cudaError_t e = cudaStreamSynchronize(t.sa);
    if (e == cudaSuccess) e = cudaStreamSynchronize(t.sb);
    ncclResult_t aa = ncclInternalError, ab = ncclInternalError;
    ncclCommGetAsyncError(a, &aa);
    ncclCommGetAsyncError(b, &ab);
    check_all(e == cudaSuccess && aa == ncclSuccess && ab == ncclSuccess && same(from_dev(x, 1000), want) &&
                  same(from_dev(y, 1000), want),
              "two communicators in the same order, one rank 2.6 s late: no error, right sums");
    ncclCommDestroy(a);
    ncclCommDestroy(b);
    return g_failed ? 1 : 0;
}

// Under CUDA_CPU_NCCL_CONCURRENT=1. Two communicators of the device on one stream: ordered,
// right sums. Then on two streams, rank 1 late: rank 0's op on the first stream still waits
// for rank 1 when rank 0 launches on the second: refused, a device fault.
static int test_concurrent() {
    TwoComms t = two_comms();
    ncclComm_t a = t.a, b = t.b;
    cudaStream_t s = t.sa, s2 = t.sb;
    float *x = t.x, *y = t.y;
    const std::vector<float>& want = t.want;
    ncclResult_t ra = ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, a, s);
    ncclResult_t rb = ncclAllReduce(y, y, 1000, ncclFloat, ncclSum, b, s);
    cudaError_t e = cudaStreamSynchronize(s);
    check_all(ra == ncclSuccess && rb == ncclSuccess && e == cudaSuccess && same(from_dev(x, 1000), want) &&
                  same(from_dev(y, 1000), want),
              "two communicators of a device on one stream: no fault, right sums");
    barrier();
    if (g_rank == 1) usleep(300 * 1000);
    ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, a, s);
    rb = ncclAllReduce(y, y, 1000, ncclFloat, ncclSum, b, s2);
    if (g_rank == 0) {
        check_mine(rb == ncclInvalidUsage && contains(ncclGetLastError(b), "may run at once on one GPU"),
                   fmt("a launch on a second stream while the other communicator's op is in flight: %s: %s",
                       ncclGetErrorString(rb), ncclGetLastError(b)));
        check_mine(cudaStreamSynchronize(s2) != cudaSuccess, "the device faulted");
    }
    barrier();
    return g_failed ? 1 : 2;
}

static int test_shared_gpu() {
    ncclUniqueId id;
    if (g_rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRank(&c, g_size, id, g_rank);
    const char* e = ncclGetLastError(nullptr);
    check_mine(r == ncclInvalidUsage && contains(e, "the same GPU") && contains(e, "ranks 0"),
               fmt("two ranks on one GPU: %s: %s", ncclGetErrorString(r), e));
    return g_failed ? 1 : 0;
}

// ---- without MPI: a forked peer that exits, or is stopped ------------------------------------------------
static int test_forked(bool stop) {
    signal(SIGCHLD, SIG_IGN);  // no zombies: an exited child is gone
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    g_size = 2;
    pid_t child = fork();
    g_rank = child == 0 ? 1 : 0;
    ncclComm_t c = nullptr;
    if (ncclCommInitRank(&c, 2, id, g_rank) != ncclSuccess) _exit(1);
    cudaStream_t s;
    cudaStreamCreate(&s);
    float* x = to_dev(values<float>(g_rank, 500));
    if (child == 0) {
        if (!stop) _exit(0);  // leaves without a word
        raise(SIGSTOP);
        ncclAllReduce(x, x, 500, ncclFloat, ncclSum, c, s);
        cudaStreamSynchronize(s);
        _exit(0);
    }
    ncclAllReduce(x, x, 500, ncclFloat, ncclSum, c, s);
    double t0 = now_s();
    ncclResult_t async = ncclSuccess;
    if (!stop) {
        cudaStreamSynchronize(s);
        ncclCommGetAsyncError(c, &async);
        check_mine(
            async == ncclRemoteError && contains(ncclGetLastError(c), "has exited") && now_s() - t0 < 5,
            fmt("a peer that exited: the op returns, async %s: %s", ncclGetErrorString(async), ncclGetLastError(c)));
        return g_failed ? 1 : 0;
    }
    usleep(3200 * 1000);  // past the inversion threshold
    bool waiting = cudaStreamQuery(s) == cudaErrorNotReady;
    ncclCommGetAsyncError(c, &async);
    check_mine(waiting && async == ncclSuccess, "a stopped peer is waited for: no error after 3.2 s");
    kill(child, SIGCONT);
    cudaError_t e = cudaStreamSynchronize(s);
    std::vector<float> want(500);
    for (size_t i = 0; i < 500; i++) want[i] = expected_sum<float>(0, i);
    check_mine(e == cudaSuccess && same(from_dev(x, 500), want), "after SIGCONT the all-reduce completes");
    return g_failed ? 1 : 0;
}

// Under CUDA_CPU_NCCL_PEERS=local (NCCL's own behaviour, docs/cuda_cpu.md): rank 1, forked,
// destroys communicator d after 0.5 s, aborts e after 0.5 s more, then exits, leaving c and f
// alone. Rank 0's destroys of d and e wait for those (NCCL 2.14+: destroy is an intra-node
// collective); its all-reduce on c is still waiting, without an async error, 1.2 s after the
// peer is gone, and only its own abort ends it; its destroy of f is still blocked after 2.3 s.
static int test_peers_local() {
    signal(SIGCHLD, SIG_IGN);
    ncclUniqueId ids[4];
    for (ncclUniqueId& id : ids) ncclGetUniqueId(&id);
    g_size = 2;
    pid_t child = fork();
    g_rank = child == 0 ? 1 : 0;
    ncclComm_t c, d, e, f;
    if (ncclCommInitRank(&c, 2, ids[0], g_rank) || ncclCommInitRank(&d, 2, ids[1], g_rank) ||
        ncclCommInitRank(&e, 2, ids[2], g_rank) || ncclCommInitRank(&f, 2, ids[3], g_rank)) {
        _exit(1);
    }
    if (child == 0) {
        usleep(500 * 1000);
        ncclCommDestroy(d);
        usleep(500 * 1000);
        ncclCommAbort(e);
        _exit(0);  // c and f never destroyed
    }
    double t0 = now_s();
    ncclResult_t r = ncclCommDestroy(d);
    double took = now_s() - t0;
    check_mine(r == ncclSuccess && took > 0.4 && took < 5,
               fmt("destroy returns once the peer destroys too (%.2f s; it does after 0.5 s)", took));
    t0 = now_s();
    r = ncclCommDestroy(e);
    took = now_s() - t0;
    check_mine(r == ncclSuccess && took > 0.3 && took < 5,
               fmt("destroy returns once the peer aborts (%.2f s; it does after 0.5 s more)", took));
    while (kill(child, 0) == 0 && now_s() - t0 < 10) usleep(10 * 1000);
    cudaStream_t s;
    cudaStreamCreate(&s);
    float* x = to_dev(values<float>(0, 500));
    r = ncclAllReduce(x, x, 500, ncclFloat, ncclSum, c, s);
    usleep(1200 * 1000);
    ncclResult_t async = ncclInternalError;
    ncclCommGetAsyncError(c, &async);
    check_mine(r == ncclSuccess && cudaStreamQuery(s) == cudaErrorNotReady && async == ncclSuccess,
               fmt("the peer exited: the all-reduce still waits after 1.2 s, async error %s", ncclGetErrorString(async)));
    t0 = now_s();
    r = ncclCommAbort(c);
    double aborted = now_s() - t0;
    cudaStreamSynchronize(s);
    took = now_s() - t0;
    check_mine(r == ncclSuccess && aborted < 0.5 && took < 2,
               fmt("its own abort returns (%.3f s) and ends the wait (%.3f s)", aborted, took));
    static std::atomic<bool> destroyed{false};
    std::thread([f] {
        ncclCommDestroy(f);
        destroyed = true;
    }).detach();
    usleep(2300 * 1000);
    check_mine(!destroyed, "destroy of a communicator the dead peer never destroyed: still blocked after 2.3 s");
    done_testing();
    fflush(stdout);
    _exit(g_failed ? 1 : 0);  // the blocked destroy's thread goes with the process
}

int main(int argc, char** argv) {
    std::string mode = argc > 1 ? argv[1] : "basic";
    if (mode == "dead" || mode == "stopped") {
        int rc = test_forked(mode == "stopped");
        done_testing();
        return rc;
    }
    if (mode == "peers_local") return test_peers_local();
    MPI_Init(&argc, &argv);
    g_mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    tap_rank = g_rank;
    int rc = 1;
    if (mode == "basic") {
        test_basic();
        rc = g_failed ? 1 : 0;
    } else if (mode == "orders" && argc > 2 && (g_size == 3 || g_size == 4)) {
        rc = test_orders(argv[2]);
    } else if (g_size != 2) {
        if (g_rank == 0) fprintf(stderr, "mode %s needs 2 ranks\n", mode.c_str());
    } else if (mode == "mismatch") {
        rc = test_mismatch();
    } else if (mode == "inversion") {
        rc = test_inversion();
    } else if (mode == "abort") {
        rc = test_abort();
    } else if (mode == "order") {
        rc = test_order();
    } else if (mode == "concurrent") {
        rc = test_concurrent();
    } else if (mode == "shared_gpu") {
        rc = test_shared_gpu();
    } else if (g_rank == 0) {
        fprintf(stderr, "unknown mode %s\n", mode.c_str());
    }
    if (tap_count > 0) done_testing();  // the plan, where this mode made checks
    MPI_Finalize();
    return rc;
}
