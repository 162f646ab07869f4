/*
 * Linear layer: out[BT,OC] = inp[BT,C] @ weight[OC,C]^T + bias[OC], weight stored as
 * PyTorch's nn.Linear does (OC rows of C). All products go through OpenBLAS sgemm; only
 * the bias sum is written here.
 * The backward accumulates (+=) into dinp, dweight and dbias via sgemm's beta = 1, so the
 * trainer can sum gradients over micro-steps straight in its gradient buffer.
 *
 * Threads: while OpenBLAS runs single-threaded (the trainer's default, run/threads.h),
 * the OpenMP threads split every product into tiles, each computed by one sgemm call, so
 * one pool of threads does all the work and none spins while another pool needs the core.
 * The tiles follow the shape alone (gemm_tiles), so the results are the same bits for any
 * OpenMP thread count. OpenBLAS's own threading does not promise that (0.3.21 changes the
 * last bits with its thread count): with OPENBLAS_NUM_THREADS > 1 (a user's choice)
 * OpenBLAS threads each product and bit-reproducible runs keep it fixed.
 * The bias sum below gives the same bits for any thread count too.
 */
#ifndef LLMC_MATMUL_H
#define LLMC_MATMUL_H

#include <cblas.h>
#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Weak, so that a program linked with another BLAS still links (and splits every product).
int openblas_get_num_threads(void) __attribute__((weak));
int openblas_get_parallel(void) __attribute__((weak));  // 0 sequential, 1 pthreads, 2 OpenMP build

// 1 when the OpenMP threads split the products: OpenBLAS is single-threaded, and not its
// OpenMP build (which, called from several threads at once, queues them on its buffers).
static inline int matmul_split_threads(void) {
    if (openblas_get_parallel && openblas_get_parallel() == 2) return 0;
    return !openblas_get_num_threads || openblas_get_num_threads() == 1;
}

// A part of an sgemm's output: rows [m0,m1), columns [n0,n1).
typedef struct {
    int m0, m1, n0, n1;
} GemmTile;

// Share i of `parts` of [0,n): bounds in multiples of 16 floats (a cache line of the output).
static inline void gemm_share(int n, int parts, int i, int* lo, int* hi) {
    long lines = (n + 15) / 16;
    *lo = (int)(lines * i / parts) * 16;
    *hi = (int)(lines * (i + 1) / parts) * 16;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

// The tiles of an M x N output, sums of K products: while the threads split the products,
// GEMM_TILES of them (fewer where a side is short), else one. The grid is fixed by the shape
// alone, so that every element is computed by the same sgemm call at any thread count (an
// OpenBLAS kernel may sum an element in an order that depends on where it sits in its
// call's output: 0.3.21's Haswell kernels do). Threads take tiles as they come free, so a
// thread the machine's other jobs hold up does fewer. Of the grids rows x cols, the one
// that reads the least: each tile's sgemm reads its rows of op(A) and its columns of op(B),
// K (M cols + N rows) floats in all. A product with K above both M and N (the classifier's
// dinp: K = Vp) re-reads operands too large for the caches, so it gets 2 tiles: 16 made its
// sgemm 1.43x slower on one thread, 8 1.25x, 2 1.03x.
#define GEMM_TILES 8
#define GEMM_TILES_LONG_K 2

typedef struct {
    int count, rows;
} GemmTiles;

static inline GemmTiles gemm_tiles(int M, int N, int K) {
    GemmTiles g = {1, 1};
    if (!matmul_split_threads()) return g;
    g.count = K > M && K > N ? GEMM_TILES_LONG_K : GEMM_TILES;
    double best = -1.0;
    for (int rows = 1; rows <= g.count; rows *= 2) {
        int cols = g.count / rows;
        double reads = (double)M * cols + (double)N * rows;
        if (best < 0.0 || reads < best) {
            best = reads;
            g.rows = rows;
        }
    }
    return g;
}

static inline GemmTile gemm_tile(const GemmTiles* g, int M, int N, int i) {
    GemmTile t;
    gemm_share(M, g->rows, i % g->rows, &t.m0, &t.m1);
    gemm_share(N, g->count / g->rows, i / g->rows, &t.n0, &t.n1);
    return t;
}

// C[tile] = alpha op(A)[tile rows] op(B)[tile columns] + beta C[tile], row-major, op(A) M x K
// and op(B) K x N as cblas_sgemm takes them.
static inline void sgemm_tile(const GemmTile* t, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int K, float alpha,
                              const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    int m = t->m1 - t->m0, n = t->n1 - t->n0;
    if (m <= 0 || n <= 0) return;
    const float* a = ta == CblasNoTrans ? A + (size_t)t->m0 * lda : A + t->m0;
    const float* b = tb == CblasNoTrans ? B + t->n0 : B + (size_t)t->n0 * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, C + (size_t)t->m0 * ldc + t->n0, ldc);
}

static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int BT, int C, int OC) {
    #pragma omp parallel if (matmul_split_threads())
    {
        GemmTiles g = gemm_tiles(BT, OC, C);
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < g.count; i++) {
            GemmTile t = gemm_tile(&g, BT, OC, i);
            // start from the bias and let sgemm add the product (beta = 1), as addmm does:
            // one pass over out instead of a second one to add the bias
            if (bias != NULL) {
                for (int r = t.m0; r < t.m1; r++) {
                    float* o = out + (size_t)r * OC;
                    for (int j = t.n0; j < t.n1; j++) o[j] = bias[j];
                }
            }
            sgemm_tile(&t, CblasNoTrans, CblasTrans, C, 1.0f, inp, C, weight, C, bias != NULL ? 1.0f : 0.0f, out, OC);
        }
    }
}

// dinp += dout @ weight (skipped when dinp == NULL); dweight += dout^T @ inp;
// dbias += column sums of dout (skipped when dbias == NULL).
static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int BT, int C, int OC) {
    #pragma omp parallel if (matmul_split_threads())
    {
        GemmTiles gi = gemm_tiles(BT, C, OC), gw = gemm_tiles(OC, C, BT);
        if (dinp != NULL) {
            #pragma omp for schedule(dynamic, 1) nowait
            for (int i = 0; i < gi.count; i++) {
                GemmTile t = gemm_tile(&gi, BT, C, i);
                sgemm_tile(&t, CblasNoTrans, CblasNoTrans, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
            }
        }
        #pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < gw.count; i++) {
            GemmTile t = gemm_tile(&gw, OC, C, i);
            sgemm_tile(&t, CblasTrans, CblasNoTrans, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
        }
    }
    if (dbias != NULL) {
        // each thread owns a block of output columns and walks the rows in order: the sum
        // order per element is fixed, and the inner loop runs along contiguous memory
        enum { OB = 64 };
        int nblocks = (OC + OB - 1) / OB;
        #pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * OB;
            int o1 = o0 + OB < OC ? o0 + OB : OC;
            double acc[OB];
            for (int o = 0; o < OB; o++) acc[o] = 0.0;
            for (int i = 0; i < BT; i++) {
                const float* d = dout + (size_t)i * OC;
                for (int o = o0; o < o1; o++) acc[o - o0] += (double)d[o];
            }
            for (int o = o0; o < o1; o++) dbias[o] += (float)acc[o - o0];
        }
    }
}

#ifdef __cplusplus
}
#endif
#endif
