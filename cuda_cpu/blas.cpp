/*
 * cuda_cpu/blas.cpp: cuBLAS and cuBLASLt for the CPU execution layer, on OpenBLAS.
 * Every definition has the toolkit header's exact prototype.
 *
 * Modelled:
 *  - cuBLAS: cublasCreate/Destroy, Set/GetStream, SetWorkspace, Set/GetMathMode, status
 *    names, cublasGemmStridedBatchedEx. cuBLASLt: handles; matmul, layout and preference
 *    descriptors with every attribute the header lists (sizes checked); the heuristic (one
 *    algorithm, or none: CUDA_CPU_BLASLT_HEURISTIC, see refused()); cublasLtMatmul with
 *    epilogues DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, DGELU_BGRAD,
 *    BGRADA, BGRADB, and strided batches.
 *  - Types from the docs' table: A = B in {fp32, bf16}, C = D in {fp32, bf16}, bf16 -> bf16
 *    or fp32, fp32 -> fp32; compute CUBLAS_COMPUTE_32F[_PEDANTIC], scale CUDA_R_32F. The
 *    FAST_TF32/_16BF/_16F compute types (fp32 only) and every math mode are accepted and
 *    computed in plain fp32 (their reduced-precision input rounding is not modelled).
 *  - The documented argument rules and statuses (resolve() and the entry points), device
 *    memory checks of every operand at call time, and the alignment contract: an algorithm
 *    from the heuristic handles pointers only as aligned as the preference's
 *    MIN_ALIGNMENT_*_BYTES (default 256) promised, and bias/aux pointers as aligned as the
 *    heuristic saw them; a less aligned pointer gets CUBLAS_STATUS_NOT_SUPPORTED.
 *  - Host pointer mode: alpha and beta are read at call time; beta == 0 leaves C unread.
 *  - cudacpu::blas_live_descriptors() (cuda_cpu.h): the cuBLASLt matmul, layout and
 *    preference descriptors created and not destroyed, for leak checks in tests.
 *
 * Arithmetic: operands converted exactly to fp32, op(A) op(B) by one cblas_sgemm (fp32, in
 * OpenBLAS's order), then beta*C, bias and epilogue in fp32 and one rounding to the output
 * type (nearest even). In a GPU-numerics build BF16 products accumulate as tensor cores add
 * (tensorcore.cpp: groups along k, truncated), split along k where the workspace (cuBLASLt's
 * argument, cublasSetWorkspace's) holds the slices' fp32 partial sums. Not modelled:
 * cuBLAS's algorithms; results are not GPU bits.
 *
 * Execution: validation and pointer checks on the calling thread, then one closure (plain
 * values: pointers, dims, scalars) queued with cudacpu::enqueue on the stream: the
 * handle's for cuBLAS (default 0), the argument for cuBLASLt.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cblas.h>

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <atomic>
#include <cstring>
#include <new>
#include <vector>

#include "internal.h"
#include "tensorcore.h"

// The opaque handle structs the headers forward-declare.
struct cublasContext {
    cudaStream_t stream;
    cublasMath_t math;
    void* workspace;  // never written; its size allows split-K (tensorcore.h)
    size_t workspace_size;
    int device;             // where its default workspace is charged (device_memory.cpp)
    size_t default_workspace;
};
struct cublasLtContext {
    int unused;
};

namespace {

// ---- descriptors, stored inside the headers' semi-opaque structs ------------------------
// (so that the *Init_internal variants work on caller-provided storage too)
struct Layout {
    uint64_t rows, cols;
    int64_t ld, stride, plane_offset;
    uint32_t type;
    int32_t order, batch, batch_mode;
};
struct MatmulDesc {
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epilogue;
    const void* bias;
    int64_t bias_stride;
    void* aux;
    int64_t aux_ld, aux_stride, alpha_stride;
    int32_t sm_target, aux_type, bias_type;
    int8_t fast_accum;
    const void *a_scale, *b_scale, *c_scale, *d_scale;
    void *amax_d, *aux_scale, *aux_amax, *d_out_scale, *emulation;
    int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, aux_scale_mode, d_out_scale_mode;
};
struct Preference {
    uint64_t max_workspace, impl_mask;
    uint32_t search_mode, reduction_mask, align[4];  // A, B, C, D
    float max_waves;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout does not fit");
static_assert(sizeof(MatmulDesc) <= sizeof(cublasLtMatmulDescOpaque_t), "MatmulDesc does not fit");
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Preference does not fit");

Layout* L(cublasLtMatrixLayout_t p) { return reinterpret_cast<Layout*>(p); }
MatmulDesc* M(cublasLtMatmulDesc_t p) { return reinterpret_cast<MatmulDesc*>(p); }
Preference* P(cublasLtMatmulPreference_t p) { return reinterpret_cast<Preference*>(p); }

// Attribute tables: which field an attribute is, and its documented size.
struct Slot {
    int attr;
    size_t offset, size;
};
#define SLOT(T, a, f) Slot{a, offsetof(T, f), sizeof(((T*)nullptr)->f)}
#define LS(a, f) SLOT(Layout, CUBLASLT_MATRIX_LAYOUT_##a, f)
const Slot kLayoutSlots[] = {
    LS(TYPE, type), LS(ORDER, order), LS(ROWS, rows), LS(COLS, cols), LS(LD, ld), LS(BATCH_COUNT, batch),
    LS(STRIDED_BATCH_OFFSET, stride), LS(PLANE_OFFSET, plane_offset), LS(BATCH_MODE, batch_mode),
};
#define DS(a, f) SLOT(MatmulDesc, CUBLASLT_MATMUL_DESC_##a, f)
const Slot kDescSlots[] = {
    DS(COMPUTE_TYPE, compute), DS(SCALE_TYPE, scale), DS(POINTER_MODE, pointer_mode), DS(TRANSA, transa),
    DS(TRANSB, transb), DS(TRANSC, transc), DS(FILL_MODE, fill), DS(EPILOGUE, epilogue), DS(BIAS_POINTER, bias),
    DS(BIAS_BATCH_STRIDE, bias_stride), DS(EPILOGUE_AUX_POINTER, aux), DS(EPILOGUE_AUX_LD, aux_ld),
    DS(EPILOGUE_AUX_BATCH_STRIDE, aux_stride), DS(ALPHA_VECTOR_BATCH_STRIDE, alpha_stride),
    DS(SM_COUNT_TARGET, sm_target), DS(A_SCALE_POINTER, a_scale), DS(B_SCALE_POINTER, b_scale),
    DS(C_SCALE_POINTER, c_scale), DS(D_SCALE_POINTER, d_scale), DS(AMAX_D_POINTER, amax_d),
    DS(EPILOGUE_AUX_DATA_TYPE, aux_type), DS(EPILOGUE_AUX_SCALE_POINTER, aux_scale),
    DS(EPILOGUE_AUX_AMAX_POINTER, aux_amax), DS(FAST_ACCUM, fast_accum), DS(BIAS_DATA_TYPE, bias_type),
    DS(A_SCALE_MODE, a_scale_mode), DS(B_SCALE_MODE, b_scale_mode), DS(C_SCALE_MODE, c_scale_mode),
    DS(D_SCALE_MODE, d_scale_mode), DS(EPILOGUE_AUX_SCALE_MODE, aux_scale_mode),
    DS(D_OUT_SCALE_POINTER, d_out_scale), DS(D_OUT_SCALE_MODE, d_out_scale_mode),
    DS(EMULATION_DESCRIPTOR, emulation),
};
#define PS(a, f) SLOT(Preference, CUBLASLT_MATMUL_PREF_##a, f)
const Slot kPrefSlots[] = {
    PS(SEARCH_MODE, search_mode), PS(MAX_WORKSPACE_BYTES, max_workspace), PS(REDUCTION_SCHEME_MASK, reduction_mask),
    PS(MIN_ALIGNMENT_A_BYTES, align[0]), PS(MIN_ALIGNMENT_B_BYTES, align[1]), PS(MIN_ALIGNMENT_C_BYTES, align[2]),
    PS(MIN_ALIGNMENT_D_BYTES, align[3]), PS(MAX_WAVES_COUNT, max_waves), PS(IMPL_MASK, impl_mask),
};
#undef LS
#undef DS
#undef PS
#undef SLOT

const char* status_name(cublasStatus_t s) {
#define NAME(x) \
    case x: return #x;
    switch (s) {
        NAME(CUBLAS_STATUS_SUCCESS) NAME(CUBLAS_STATUS_NOT_INITIALIZED) NAME(CUBLAS_STATUS_ALLOC_FAILED)
        NAME(CUBLAS_STATUS_INVALID_VALUE) NAME(CUBLAS_STATUS_ARCH_MISMATCH) NAME(CUBLAS_STATUS_MAPPING_ERROR)
        NAME(CUBLAS_STATUS_EXECUTION_FAILED) NAME(CUBLAS_STATUS_INTERNAL_ERROR) NAME(CUBLAS_STATUS_NOT_SUPPORTED)
        NAME(CUBLAS_STATUS_LICENSE_ERROR)
    }
#undef NAME
    return "CUBLAS_STATUS_UNKNOWN";
}

// Every failing call says why in one diagnostic line, then returns its status.
__attribute__((format(printf, 3, 4))) cublasStatus_t fail(cublasStatus_t st, const char* fn, const char* fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cudacpu::diag("%s: %s (%s)", fn, msg, status_name(st));
    return st;
}

template <size_t N>
const Slot* find_slot(const Slot (&slots)[N], int attr) {
    for (const Slot& s : slots)
        if (s.attr == attr) return &s;
    return nullptr;
}

cublasStatus_t set_attr(const char* fn, void* obj, const Slot* s, int attr, const void* buf, size_t size) {
    if (!obj || !buf) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "descriptor or buf is NULL");
    if (!s) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "unknown attribute %d", attr);
    if (size != s->size)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes %zu bytes, got %zu", attr, s->size, size);
    memcpy((char*)obj + s->offset, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// The documented GetAttribute protocol: size 0 asks for the size.
cublasStatus_t get_attr(const char* fn, const void* obj, const Slot* s, int attr, void* buf, size_t size,
                        size_t* written) {
    if (!obj || !s) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL descriptor or unknown attribute %d", attr);
    if (size == 0) {
        if (!written) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "sizeInBytes is 0 and sizeWritten is NULL");
        *written = s->size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != s->size)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes %zu bytes, got %zu (or buf NULL)", attr,
                    s->size, size);
    memcpy(buf, (const char*)obj + s->offset, size);
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- the resolved operation -------------------------------------------------------------
struct Mat {  // one operand, column-major: element (i, j) of batch b at i + j*ld + b*stride
    char* ptr;
    cudaDataType type;
    int64_t rows, cols, ld, stride;
};
struct Plan {
    Mat a, b, c, d, bias, aux;
    bool ta, tb;
    int64_t m, n, k;
    int batch;
    uint32_t epilogue;
    float alpha, beta;
    int splits;  // split-K slices of the tensor-core model (tensorcore.h); 0 or 1: none
};

size_t elem_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// Bytes from the first to one past the last element any batch entry touches.
size_t mat_bytes(const Mat& x, int batch) {
    if (x.rows == 0 || x.cols == 0 || batch == 0) return 0;
    int64_t last = (x.cols - 1) * x.ld + x.rows;  // ld 0 (a broadcast C) reads one column
    return (size_t)((int64_t)(batch - 1) * x.stride + last) * elem_size(x.type);
}

uint32_t align_of(const void* p) {  // as in the docs: 256 is the most anything asks for
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

bool epi_adds_bias(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epi_gelu(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epi_writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool epi_dgelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool epi_bias_grad(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
bool epi_uses_bias(uint32_t e) { return epi_adds_bias(e) || epi_bias_grad(e); }
bool epi_uses_aux(uint32_t e) { return epi_writes_aux(e) || epi_dgelu(e); }
bool epi_known(uint32_t e) { return e == CUBLASLT_EPILOGUE_DEFAULT || epi_uses_bias(e) || epi_gelu(e) || epi_dgelu(e); }

// The docs' datatype tables (gemmEx and cublasLtMatmul): CUBLAS_COMPUTE_32F[_PEDANTIC]
// takes bf16 -> bf16 or fp32 and fp32 -> fp32; the FAST_* types fp32 only (computed here in
// plain fp32). Other compute types are not modelled.
bool types_supported(int compute, int ab, int cd) {
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
        compute == CUBLAS_COMPUTE_32F_FAST_16F)
        return ab == CUDA_R_32F && cd == CUDA_R_32F;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) return false;
    return (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F)) || (ab == CUDA_R_32F && cd == CUDA_R_32F);
}
bool valid_op(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }  // C == T for reals

bool same_layout(const Layout& x, const Layout& y) {
    return x.type == y.type && x.order == y.order && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld &&
           x.batch == y.batch && x.stride == y.stride;
}

Mat mat_of(const Layout& l) {
    return Mat{nullptr, (cudaDataType)l.type, (int64_t)l.rows, (int64_t)l.cols, l.ld, l.stride};
}

cublasStatus_t check_layout(const char* fn, char name, const Layout& l, bool may_broadcast) {
    if (l.order != CUBLASLT_ORDER_COL)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: order %d, only CUBLASLT_ORDER_COL is modelled", name,
                    l.order);
    if (l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l.plane_offset != 0)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: only strided batches of real matrices are modelled", name);
    if (l.rows > INT32_MAX || l.cols > INT32_MAX || l.ld > INT32_MAX)  // "usually only int32_t values"
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: %llux%llu, ld %lld exceeds int32", name,
                    (unsigned long long)l.rows, (unsigned long long)l.cols, (long long)l.ld);
    if (l.ld < (int64_t)l.rows && !(may_broadcast && l.ld == 0))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%c: ld %lld < rows %llu", name, (long long)l.ld,
                    (unsigned long long)l.rows);
    if (l.batch < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%c: batch count %d < 1", name, l.batch);
    if (l.stride < 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: negative batch stride", name);
    return CUBLAS_STATUS_SUCCESS;
}

// Turns the descriptors into a Plan (no pointers or scalars yet) or says which rule fails:
// INVALID_VALUE for impossible or conflicting configurations, NOT_SUPPORTED for valid
// cuBLASLt configurations this layer does not implement. Shared by the heuristic and matmul.
cublasStatus_t resolve(const char* fn, cublasLtMatmulDesc_t dh, cublasLtMatrixLayout_t ah, cublasLtMatrixLayout_t bh,
                       cublasLtMatrixLayout_t ch, cublasLtMatrixLayout_t dlh, Plan* p) {
    if (!dh || !ah || !bh || !dlh) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a descriptor is NULL");
    const MatmulDesc& desc = *M(dh);
    const Layout &A = *L(ah), &B = *L(bh), &D = *L(dlh), &C = ch ? *L(ch) : D;  // no Cdesc: Cdesc == Ddesc
    if (desc.scale != CUDA_R_32F || A.type != B.type || C.type != D.type ||
        !types_supported(desc.compute, (int)A.type, (int)D.type))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %u B %u C %u D %u, compute %d, scale %d: not modelled",
                    A.type, B.type, C.type, D.type, desc.compute, desc.scale);
    if (desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "only CUBLASLT_POINTER_MODE_HOST is modelled");
    if (!valid_op(desc.transa) || !valid_op(desc.transb))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa %d / transb %d", desc.transa, desc.transb);
    if (desc.transc != CUBLAS_OP_N || desc.fill != CUBLAS_FILL_MODE_FULL)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC must be CUBLAS_OP_N and FILL_MODE full");
    cublasStatus_t st;
    if ((st = check_layout(fn, 'A', A, false)) || (st = check_layout(fn, 'B', B, false)) ||
        (st = check_layout(fn, 'C', C, ch && ch != dlh)) || (st = check_layout(fn, 'D', D, false)))
        return st;
    bool ta = desc.transa != CUBLAS_OP_N, tb = desc.transb != CUBLAS_OP_N;
    int64_t m = ta ? A.cols : A.rows, ka = ta ? A.rows : A.cols;
    int64_t kb = tb ? B.cols : B.rows, n = tb ? B.rows : B.cols;
    if (m != (int64_t)D.rows || n != (int64_t)D.cols || ka != kb)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "op(A) is %lldx%lld, op(B) %lldx%lld, D %llux%llu", (long long)m,
                    (long long)ka, (long long)kb, (long long)n, (unsigned long long)D.rows, (unsigned long long)D.cols);
    // Out of place, C and D must agree on everything but ld (docs, cublasLtMatmul note).
    if (C.rows != D.rows || C.cols != D.cols || C.batch != D.batch)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C and D differ in rows, columns or batch count");
    if (A.batch != D.batch || B.batch != D.batch)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch counts A %d B %d D %d differ", A.batch, B.batch, D.batch);

    uint32_t e = desc.epilogue;
    if (!epi_known(e)) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u is not modelled", e);
    int bias_type = desc.bias_type == -1 ? (int)D.type : desc.bias_type;
    int aux_type = desc.aux_type == -1 ? (int)D.type : desc.aux_type;
    if (epi_uses_bias(e) && bias_type != (int)D.type)  // datatype table: bias type is D's here
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias type %d with D type %u", bias_type, D.type);
    if (epi_uses_aux(e)) {
        if (aux_type != (int)D.type)  // documented: unsupported aux type -> INVALID_VALUE
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "aux type %d with D type %u", aux_type, D.type);
        if (desc.aux_ld < (int64_t)D.rows || desc.aux_ld % 8 || desc.aux_stride % 8 || desc.aux_stride < 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "EPILOGUE_AUX_LD %lld must be >= rows %llu and a multiple of 8, AUX_BATCH_STRIDE %lld too",
                        (long long)desc.aux_ld, (unsigned long long)D.rows, (long long)desc.aux_stride);
    }
    if (epi_uses_bias(e) && desc.bias_stride < 0)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "negative BIAS_BATCH_STRIDE");
    // Scaling factors and amax exist for fp8 only: documented INVALID_VALUE for these types.
    if (desc.a_scale || desc.b_scale || desc.c_scale || desc.d_scale || desc.amax_d || desc.aux_scale ||
        desc.aux_amax || desc.d_out_scale)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "scale/amax pointers are for fp8 types only");
    if (desc.a_scale_mode || desc.b_scale_mode || desc.c_scale_mode || desc.d_scale_mode || desc.aux_scale_mode ||
        desc.d_out_scale_mode)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "non-scalar scale modes are not modelled");

    *p = Plan{};
    p->a = mat_of(A), p->b = mat_of(B), p->c = mat_of(C), p->d = mat_of(D);
    p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = ka, p->batch = D.batch, p->epilogue = e;
    int64_t bias_len = e == CUBLASLT_EPILOGUE_BGRADB ? n : m;  // BGRADB: one per column of D
    p->bias = Mat{nullptr, (cudaDataType)bias_type, bias_len, 1, bias_len, desc.bias_stride};
    p->aux = Mat{nullptr, (cudaDataType)aux_type, m, n, desc.aux_ld, desc.aux_stride};
    return CUBLAS_STATUS_SUCCESS;
}

// ---- execution (runs on the stream's worker) --------------------------------------------
float load(const Mat& x, const char* base, int64_t i) {
    return x.type == CUDA_R_32F ? ((const float*)base)[i] : cudacpu::bf16_bits_to_float(((const uint16_t*)base)[i]);
}
void store(const Mat& x, char* base, int64_t i, float v) {
    if (x.type == CUDA_R_32F)
        ((float*)base)[i] = v;
    else
        ((uint16_t*)base)[i] = cudacpu::float_to_bf16_bits(v);  // the one rounding
}
char* entry(const Mat& x, int b) {  // batch entry b
    return x.ptr ? x.ptr + (int64_t)b * x.stride * (int64_t)elem_size(x.type) : nullptr;
}

// An operand packed into host fp32 (bf16 -> fp32 is exact), leading dimension max(1, rows).
// Always a copy, fp32 too: OpenBLAS's own threads must not touch device memory (in
// CUDA_CPU_PROTECT mode only the layer's workers may).
const float* as_fp32(const Mat& x, const char* base, std::vector<float>& buf, int64_t* ld) {
    buf.resize((size_t)(x.rows * x.cols));
    for (int64_t j = 0; j < x.cols; j++)
        for (int64_t i = 0; i < x.rows; i++) buf[(size_t)(i + j * x.rows)] = load(x, base, i + j * x.ld);
    *ld = x.rows > 1 ? x.rows : 1;
    return buf.data();
}

// GELU, tanh approximation (the docs' footnote), and its derivative, in fp32.
const float kGeluS = 0.7978845608028654f, kGeluC = 0.044715f;
float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kGeluS * (x + kGeluC * x * x * x))); }
float gelu_grad(float x) {
    float t = tanhf(kGeluS * (x + kGeluC * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluS * (1.0f + 3.0f * kGeluC * x * x);
}

void run_entry(const Plan& p, int b) {
    std::vector<float> abuf, bbuf, acc((size_t)(p.m * p.n), 0.0f);
    int64_t lda = 1, ldb = 1;
    const float* A = as_fp32(p.a, entry(p.a, b), abuf, &lda);
    const float* B = as_fp32(p.b, entry(p.b, b), bbuf, &ldb);
    // acc = alpha * op(A) op(B), fp32; BF16 under GPU numerics as tensor cores add (tensorcore.cpp)
    if (p.m && p.n && p.k && p.a.type == CUDA_R_16BF && cudacpu::tc_gemm_modelled())
        cudacpu::tc_gemm(p.m, p.n, p.k, p.alpha, A, p.ta ? lda : 1, p.ta ? 1 : lda, B, p.tb ? 1 : ldb, p.tb ? ldb : 1,
                         p.splits, acc.data());
    else if (p.m && p.n && p.k)
        cblas_sgemm(CblasColMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, (int)p.m,
                    (int)p.n, (int)p.k, p.alpha, A, (int)lda, B, (int)ldb, 0.0f, acc.data(), (int)p.m);
    uint32_t e = p.epilogue;
    const char* C = entry(p.c, b);
    char *D = entry(p.d, b), *bias = epi_uses_bias(e) ? entry(p.bias, b) : nullptr;
    char* aux = epi_uses_aux(e) ? entry(p.aux, b) : nullptr;
    std::vector<float> grad((size_t)p.bias.rows, 0.0f);
    for (int64_t j = 0; j < p.n; j++) {
        for (int64_t i = 0; i < p.m; i++) {
            float v = acc[(size_t)(i + j * p.m)];
            if (p.beta != 0.0f) v += p.beta * load(p.c, C, i + j * p.c.ld);  // beta == 0: C unread
            if (epi_adds_bias(e)) v += load(p.bias, bias, i);  // bias added before the activation
            if (epi_writes_aux(e)) store(p.aux, aux, i + j * p.aux.ld, v);  // GELU's input
            if (epi_gelu(e)) v = gelu(v);
            if (epi_dgelu(e)) v *= gelu_grad(load(p.aux, aux, i + j * p.aux.ld));
            if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD) grad[(size_t)i] += v;  // of D, before rounding
            store(p.d, D, i + j * p.d.ld, v);
        }
    }
    // BGRADA / BGRADB: op(A) summed over k per row, op(B) summed over k per column.
    if (e == CUBLASLT_EPILOGUE_BGRADA)
        for (int64_t i = 0; i < p.m; i++)
            for (int64_t kk = 0; kk < p.k; kk++) grad[(size_t)i] += A[p.ta ? kk + i * lda : i + kk * lda];
    if (e == CUBLASLT_EPILOGUE_BGRADB)
        for (int64_t j = 0; j < p.n; j++)
            for (int64_t kk = 0; kk < p.k; kk++) grad[(size_t)j] += B[p.tb ? j + kk * ldb : kk + j * ldb];
    if (epi_bias_grad(e))
        for (int64_t i = 0; i < p.bias.rows; i++) store(p.bias, bias, i, grad[(size_t)i]);
}

void run_plan(const Plan& p) {
    for (int b = 0; b < p.batch; b++) run_entry(p, b);
}

// Call-time checks of every operand the plan will touch: device memory (or pinned, as a
// kernel may use), non-NULL, and at least as aligned as `need` (A, B, C, D, bias, aux).
cublasStatus_t check_operands(const char* fn, const Plan& p, const uint32_t need[6], cublasStatus_t misaligned) {
    struct Use {
        const char* name;
        const Mat* m;
        bool used;
    } uses[6] = {{"A", &p.a, true}, {"B", &p.b, true}, {"C", &p.c, p.beta != 0.0f}, {"D", &p.d, true},
                 {"bias", &p.bias, epi_uses_bias(p.epilogue)}, {"aux", &p.aux, epi_uses_aux(p.epilogue)}};
    for (int u = 0; u < 6; u++) {
        size_t bytes = mat_bytes(*uses[u].m, p.batch);
        if (!uses[u].used || bytes == 0) continue;
        const void* ptr = uses[u].m->ptr;
        if (!ptr) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s is NULL", uses[u].name);
        char what[96];
        snprintf(what, sizeof(what), "%s %s", fn, uses[u].name);
        if (!cudacpu::check_device_range(ptr, bytes, what, true))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s (%p, %zu bytes) is not device memory", uses[u].name, ptr,
                        bytes);
        if (align_of(ptr) < need[u])
            return fail(misaligned, fn,
                        "%s (%p) is %u-byte aligned, the algorithm was chosen for %u "
                        "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, or the pointer seen by the heuristic)",
                        uses[u].name, ptr, align_of(ptr), need[u]);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ---- the heuristic's "no algorithm" (CUDA_CPU_BLASLT_HEURISTIC) ------------------------------
// A GPU's cuBLASLt has kernels for some configurations only, and the docs do not list them:
// cublasLtMatmulAlgoGetHeuristic "retval CUBLAS_STATUS_NOT_SUPPORTED if no heuristic function
// available for current configuration", or succeeds with returnAlgoCount 0 (cublasLt.h). A
// caller asking for an epilogue must have a way without it. Modes:
//   documented (default): no algorithm where the docs say the heuristic may exclude every
//     one: the heuristic "depend[s] on [the bias and aux pointers'] value to determine
//     expected pointer alignment" (cublasLt.h, cublasLtMatmulDescAttributes_t: BIAS_POINTER,
//     EPILOGUE_AUX_POINTER) and a smaller MIN_ALIGNMENT_*_BYTES "will exclude algorithms
//     that can not work with" it (cublasLtMatmulPreferenceAttributes_t). The docs name no
//     number; the layer takes 16 bytes, one 128-bit access (what AUX_LD's "must be divisible
//     by 8" gives each column of a bf16 aux matrix): a fused request (below) with any operand
//     less aligned than that gets none.
//   none: no fused request gets an algorithm.
//   random: documented's refusals, and each other fused request refused or not by a hash of
//     what the heuristic sees (types, shape, transposes, epilogue, alignments, aux ld) and
//     CUDA_CPU_SEED: the same answer for the same request in every call and process.
//   all: every valid request gets its algorithm (what the layer did before these modes).
// A fused request: an epilogue other than DEFAULT, or a bias or aux pointer set. A plain
// matmul always has an algorithm (a GPU's cuBLASLt has one for every type pair it lists).
enum HeuristicMode { H_DOCUMENTED, H_NONE, H_RANDOM, H_ALL };

HeuristicMode heuristic_mode() {
    static const char* const names[] = {"documented", "none", "random", "all"};
    static const HeuristicMode mode = (HeuristicMode)cudacpu::env_choice("BLASLT_HEURISTIC", names, 4);
    return mode;
}

// Whether the heuristic answers "no algorithm"; why (for the documented refusal's message).
bool refused(const Plan& p, const MatmulDesc& desc, const uint32_t al[6], const char** why) {
    bool fused = p.epilogue != CUBLASLT_EPILOGUE_DEFAULT || desc.bias || desc.aux;
    HeuristicMode mode = heuristic_mode();
    if (!fused || mode == H_ALL) return false;
    *why = nullptr;
    if (mode == H_NONE) return true;
    bool uses[6] = {true, true, true, true, epi_uses_bias(p.epilogue), epi_uses_aux(p.epilogue)};
    for (int u = 0; u < 6; u++) {
        if (uses[u] && al[u] < 16) {
            *why = u < 4 ? "an operand less than 16-byte aligned (MIN_ALIGNMENT_*_BYTES)"
                         : "a bias or aux pointer less than 16-byte aligned";
            return true;
        }
    }
    if (mode != H_RANDOM) return false;
    const int64_t seen[] = {(int64_t)p.a.type, (int64_t)p.d.type, desc.compute, p.ta, p.tb, p.m, p.n, p.k, p.batch,
                            (int64_t)p.epilogue, (int64_t)p.bias.type, desc.aux_ld, desc.bias_stride, desc.aux_stride,
                            al[0], al[1], al[2], al[3], al[4], al[5]};
    uint64_t h = cudacpu::splitmix64((uint64_t)cudacpu::env_long("SEED", 1));
    for (int64_t v : seen) h = cudacpu::splitmix64(h ^ (uint64_t)v);
    return (h >> 63) != 0;
}

cublasStatus_t submit(const char* fn, cudaStream_t stream, const Plan& p) {
    cudaError_t err = cudacpu::enqueue(stream, fn, [p] { run_plan(p); });
    if (err != cudaSuccess)
        return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, "could not queue on the stream (cudaError %d)", (int)err);
    return CUBLAS_STATUS_SUCCESS;
}

// What cublasLtMatmulAlgo_t.data holds: a tag, the types it was chosen for, and the
// alignments (bytes, 16 bits each) it handles: A B C D in data[2], bias aux in data[3].
const uint64_t kAlgoTag = 0x6370752d626c6173ull;  // "cpu-blas"
uint64_t type_key(const Plan& p, const MatmulDesc& d) {
    return (uint64_t)p.a.type | (uint64_t)p.d.type << 8 | (uint64_t)(uint32_t)d.compute << 16 |
           (uint64_t)(uint32_t)d.scale << 32;
}

// cuBLASLt descriptors made by the *Create functions and not yet destroyed.
std::atomic<long> g_live_descriptors{0};

// The *Create functions: storage for the header's opaque struct, then its *Init.
template <typename Opaque, typename Init>
cublasStatus_t create(const char* fn, Opaque** out, Init init) {
    if (!out) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "output pointer is NULL");
    *out = new (std::nothrow) Opaque;
    if (!*out) return CUBLAS_STATUS_ALLOC_FAILED;
    g_live_descriptors++;
    return init(*out);
}
template <typename Opaque>
cublasStatus_t destroy(Opaque* p) {
    if (p) g_live_descriptors--;
    delete p;  // NULL is fine
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

namespace cudacpu {
long blas_live_descriptors(void) { return g_live_descriptors.load(); }  // declared in cuda_cpu.h
}  // namespace cudacpu

// ======================================================================================
// cuBLAS
// ======================================================================================
extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "handle is NULL");
    int device = cudacpu::current_device();
    size_t workspace = cudacpu::cublas_workspace_bytes();  // the handle's default workspace, on the device
    if (!cudacpu::device_memory_charge(device, workspace)) {
        return fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate", "no device memory for the default workspace");
    }
    *handle = new (std::nothrow) cublasContext{nullptr, CUBLAS_DEFAULT_MATH, nullptr, 0, device, workspace};
    if (!*handle) cudacpu::device_memory_uncharge(device, workspace);
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "handle is NULL");
    // The handle still uses its stream while it is released (its workspace is freed in
    // stream order): a stream destroyed first is a use after free on a GPU.
    if (!cudacpu::stream_alive(handle->stream)) {
        return fail(CUBLAS_STATUS_INTERNAL_ERROR, "cublasDestroy",
                    "the handle is bound to a stream that was destroyed (cublasSetStream): destroy the handle first");
    }
    cudaDeviceSynchronize();  // documented: destroying a handle synchronizes the device
    cudacpu::device_memory_uncharge(handle->device, handle->default_workspace);
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "handle is NULL");
    handle->stream = streamId;
    handle->workspace = nullptr;  // documented: back to the default workspace pool
    handle->workspace_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetStream", "handle is NULL");
    if (!streamId) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream", "streamId is NULL");
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace", "handle is NULL");
    if ((uintptr_t)workspace % 256)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "workspace %p not 256-byte aligned", workspace);
    handle->workspace = workspace;
    handle->workspace_size = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}

// Every math mode computes plain fp32 here; the documented values (optionally with
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) are accepted, anything else is not.
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode", "handle is NULL");
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
        base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_FP32_EMULATED_BF16X9_MATH &&
        base != CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode", "mode %d", (int)mode);
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetMathMode", "handle is NULL");
    if (!mode) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode", "mode is NULL");
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return status_name(status); }

// C[i] = alpha op(A[i]) op(B[i]) + beta C[i], i < batchCount; statuses as documented.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    const char* fn = "cublasGemmStridedBatchedEx";
    if (!handle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is NULL");
    if (m < 0 || n < 0 || k < 0 || batchCount < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "m %d n %d k %d batchCount %d", m, n, k, batchCount);
    if (!valid_op(transa) || !valid_op(transb))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa %d / transb %d", (int)transa, (int)transb);
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    int rows_a = ta ? k : m, rows_b = tb ? n : k;
    if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "lda %d ldb %d ldc %d: each must be >= max(1, %d / %d / %d)", lda,
                    ldb, ldc, rows_a, rows_b, m);
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is NULL");
    if (Atype != Btype || !types_supported(computeType, Atype, Ctype))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %d B %d C %d with compute %d are not in the table",
                    (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "algo %d: only CUBLAS_GEMM_DEFAULT is modelled", (int)algo);
    if (strideA < 0 || strideB < 0 || strideC < 0)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "negative strides are not modelled");
    if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;

    Plan p{};
    p.a = Mat{(char*)A, Atype, rows_a, ta ? m : k, lda, strideA};
    p.b = Mat{(char*)B, Btype, rows_b, tb ? k : n, ldb, strideB};
    p.c = p.d = Mat{(char*)C, Ctype, m, n, ldc, strideC};
    p.ta = ta, p.tb = tb, p.m = m, p.n = n, p.k = k, p.batch = batchCount;
    p.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    p.alpha = *(const float*)alpha;  // host pointer mode: the values at call time
    p.beta = *(const float*)beta;
    // No alignment contract here: a pointer must only be aligned to its element.
    uint32_t need[6] = {(uint32_t)elem_size(Atype), (uint32_t)elem_size(Btype), (uint32_t)elem_size(Ctype),
                        (uint32_t)elem_size(Ctype), 1, 1};
    cublasStatus_t st = check_operands(fn, p, need, CUBLAS_STATUS_INVALID_VALUE);
    p.splits = cudacpu::tc_splits(p.m, p.n, p.k, p.batch, handle->workspace_size);  // cublasSetWorkspace's
    return st ? st : submit(fn, handle->stream, p);
}

// ======================================================================================
// cuBLASLt
// ======================================================================================
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
    if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "lightHandle is NULL");
    *lightHandle = new (std::nothrow) cublasLtContext{0};
    return *lightHandle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtDestroy", "lightHandle is NULL");
    cudaDeviceSynchronize();  // documented, as for cublasDestroy
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return status_name(status); }

// ---- matrix layouts ---------------------------------------------------------------------
cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t matLayout, size_t size, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
    if (!matLayout || size < sizeof(Layout)) return CUBLAS_STATUS_ALLOC_FAILED;
    // ld is not checked here (the docs list no such status): heuristic and matmul do.
    new (matLayout) Layout{rows, cols, ld, 0, 0, (uint32_t)type, CUBLASLT_ORDER_COL, 1, CUBLASLT_BATCH_MODE_STRIDED};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    return create("cublasLtMatrixLayoutCreate", matLayout, [&](cublasLtMatrixLayout_t l) {
        return cublasLtMatrixLayoutInit_internal(l, sizeof(*l), type, rows, cols, ld);
    });
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    return destroy(matLayout);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
    return set_attr("cublasLtMatrixLayoutSetAttribute", matLayout, find_slot(kLayoutSlots, attr), attr, buf,
                    sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t sizeInBytes, size_t* sizeWritten) {
    return get_attr("cublasLtMatrixLayoutGetAttribute", matLayout, find_slot(kLayoutSlots, attr), attr, buf,
                    sizeInBytes, sizeWritten);
}

// ---- matmul descriptors -------------------------------------------------------------------
cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t matmulDesc, size_t size,
                                               cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (!matmulDesc || size < sizeof(MatmulDesc)) return CUBLAS_STATUS_ALLOC_FAILED;
    MatmulDesc* d = new (matmulDesc) MatmulDesc{};
    d->compute = computeType, d->scale = scaleType, d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N, d->fill = CUBLAS_FILL_MODE_FULL;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT, d->aux_type = -1, d->bias_type = -1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    return create("cublasLtMatmulDescCreate", matmulDesc, [&](cublasLtMatmulDesc_t d) {
        return cublasLtMatmulDescInit_internal(d, sizeof(*d), computeType, scaleType);
    });
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    return destroy(matmulDesc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
    return set_attr("cublasLtMatmulDescSetAttribute", matmulDesc, find_slot(kDescSlots, attr), attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t sizeInBytes, size_t* sizeWritten) {
    return get_attr("cublasLtMatmulDescGetAttribute", matmulDesc, find_slot(kDescSlots, attr), attr, buf,
                    sizeInBytes, sizeWritten);
}

// ---- preferences ------------------------------------------------------------------------
cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size) {
    if (!pref || size < sizeof(Preference)) return CUBLAS_STATUS_ALLOC_FAILED;
    // Documented defaults: best fit, no workspace, every reduction scheme, 256-byte alignment.
    new (pref) Preference{0, ~0ull, CUBLASLT_SEARCH_BEST_FIT, CUBLASLT_REDUCTION_SCHEME_MASK, {256, 256, 256, 256}, 0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    return create("cublasLtMatmulPreferenceCreate", pref, [](cublasLtMatmulPreference_t p) {
        return cublasLtMatmulPreferenceInit_internal(p, sizeof(*p));
    });
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return destroy(pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
    return set_attr("cublasLtMatmulPreferenceSetAttribute", pref, find_slot(kPrefSlots, attr), attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
    return get_attr("cublasLtMatmulPreferenceGetAttribute", pref, find_slot(kPrefSlots, attr), attr, buf, sizeInBytes,
                    sizeWritten);
}

// ---- heuristic and matmul -----------------------------------------------------------------
// One algorithm exists: fp32 FMA, no workspace, one wave. It is returned when the
// configuration is valid and supported and the preference does not exclude it.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
    const char* fn = "cublasLtMatmulAlgoGetHeuristic";
    if (returnAlgoCount) *returnAlgoCount = 0;
    if (!lightHandle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "lightHandle is NULL");
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !preference)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d, or a NULL result/preference pointer",
                    requestedAlgoCount);
    Plan p;
    cublasStatus_t st = resolve(fn, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st) return st;
    const Preference& pref = *P(preference);
    const MatmulDesc& desc = *M(operationDesc);
    uint64_t impl = CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F;
    impl |= p.a.type == CUDA_R_16BF ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                                    : CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
    if (pref.search_mode != CUBLASLT_SEARCH_BEST_FIT || (impl & ~pref.impl_mask) ||
        (pref.max_waves > 0.0f && pref.max_waves < 1.0f))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "the preference excludes the one algorithm (fp32 FMA, 1 wave)");
    // The promised alignments (the bias/aux pointers' own, as the docs say the heuristic
    // reads them); below an element's size no algorithm can work.
    const Mat* mats[6] = {&p.a, &p.b, &p.c, &p.d, &p.bias, &p.aux};
    const char* names[6] = {"A", "B", "C", "D", "bias", "aux"};
    uint32_t al[6] = {pref.align[0], pref.align[1], pref.align[2], pref.align[3],
                      align_of(desc.bias), align_of(desc.aux)};
    for (int u = 0; u < 6; u++) {
        if (al[u] > 256) al[u] = 256;
        bool used = u < 4 || (u == 4 ? epi_uses_bias(p.epilogue) : epi_uses_aux(p.epilogue));
        if (used && al[u] < elem_size(mats[u]->type))
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "alignment %u of %s is below its element size", al[u],
                        names[u]);
    }
    const char* why = nullptr;
    if (refused(p, desc, al, &why)) {  // both documented forms of "no algorithm"
        if (why) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "no algorithm for epilogue %u with %s", p.epilogue, why);
        return CUBLAS_STATUS_SUCCESS;  // returnAlgoCount 0
    }
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof(r));
    r.algo.data[0] = kAlgoTag;
    r.algo.data[1] = type_key(p, desc);
    r.algo.data[2] = (uint64_t)al[0] | (uint64_t)al[1] << 16 | (uint64_t)al[2] << 32 | (uint64_t)al[3] << 48;
    r.algo.data[3] = (uint64_t)al[4] | (uint64_t)al[5] << 16;
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    heuristicResultsArray[0] = r;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    const char* fn = "cublasLtMatmul";
    if (!lightHandle) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "lightHandle is NULL");
    Plan p;
    cublasStatus_t st = resolve(fn, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st) return st;
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is NULL");
    // In place (C == D) the docs require Cdesc == Ddesc.
    if (C == D && Cdesc && Cdesc != Ddesc && !same_layout(*L(Cdesc), *L(Ddesc)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C == D (in place) needs Cdesc == Ddesc (ld %lld vs %lld)",
                    (long long)L(Cdesc)->ld, (long long)L(Ddesc)->ld);
    const MatmulDesc& desc = *M(computeDesc);
    p.alpha = *(const float*)alpha;  // host pointer mode: the values at call time
    p.beta = *(const float*)beta;
    p.a.ptr = (char*)A, p.b.ptr = (char*)B, p.c.ptr = (char*)C, p.d.ptr = (char*)D;
    p.bias.ptr = (char*)desc.bias, p.aux.ptr = (char*)desc.aux;

    // algo NULL: the implicit query with default preferences (256-byte alignment).
    uint32_t need[6] = {256, 256, 256, 256, align_of(desc.bias), align_of(desc.aux)};
    if (algo) {
        if (algo->data[0] != kAlgoTag || algo->data[1] != type_key(p, desc))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo does not come from the heuristic for these types");
        for (int u = 0; u < 4; u++) need[u] = (uint32_t)(algo->data[2] >> (16 * u)) & 0xffff;
        need[4] = (uint32_t)algo->data[3] & 0xffff, need[5] = (uint32_t)(algo->data[3] >> 16) & 0xffff;
    }
    // The algorithm needs no workspace, but what is passed must be valid (docs: 256B aligned).
    if (workspaceSizeInBytes) {
        if (!workspace || (uintptr_t)workspace % 256)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p is NULL or not 256-byte aligned", workspace);
        if (!cudacpu::check_device_range(workspace, workspaceSizeInBytes, "cublasLtMatmul workspace", true))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace: not %zu bytes of device memory",
                        workspaceSizeInBytes);
    }
    if (epi_uses_bias(p.epilogue) && !desc.bias)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", p.epilogue);
    if (epi_uses_aux(p.epilogue) && !desc.aux)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER",
                    p.epilogue);
    st = check_operands(fn, p, need, CUBLAS_STATUS_NOT_SUPPORTED);
    p.splits = cudacpu::tc_splits(p.m, p.n, p.k, p.batch, workspaceSizeInBytes);  // split-K where it fits
    return st ? st : submit(fn, stream, p);
}

}  // extern "C"
