// cuDNN SDPA attention: the contract is in llmc/cudnn_attention.h. Compiled only by
// `make ... USE_CUDNN=1` (BF16), against the cuDNN C++ frontend's graph API.
#include "llmc/cudnn_attention.h"

#include <cudnn_frontend.h>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <unordered_map>

#include "llmc/gpt2_kernels.h"
#include "llmc/utils.h"

static int report_graphs = 1;  // cudnn_attention_report

#if defined(ENABLE_FP32)
#error "llmc/cudnn_attention.cpp: cuDNN's SDPA has no fp32 path; build USE_CUDNN=1 with PRECISION=BF16"
#endif

namespace fe = cudnn_frontend;

namespace {

// The variant pack names each tensor of a graph by one of these.
enum TensorUid : int64_t { UID_Q = 1, UID_K, UID_V, UID_SCALE, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

enum Direction { FORWARD = 0, BACKWARD = 1 };
typedef std::array<int, 5> GraphKey;  // B, T, NH, hs, Direction

struct CudnnAttention {
    cudnnHandle_t handle = nullptr;
    void* workspace = nullptr;
    int64_t workspace_bytes = 0;
    std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> graphs;
};
CudnnAttention state;

const char* direction_name(int dir) { return dir == FORWARD ? "forward" : "backward"; }

void check_cuda(cudaError_t err, const char* what) {
    if (err != cudaSuccess) fatal("cudnn attention: %s: %s", what, cudaGetErrorString(err));
}

void check_fe(fe::error_t err, const char* what, const GraphKey& k) {
    if (err.is_good()) return;
    fatal("cudnn attention: %s of the %s graph for B=%d T=%d NH=%d hs=%d failed: %s (use --attention flash or naive)",
          what, direction_name(k[4]), k[0], k[1], k[2], k[3], err.get_message().c_str());
}

cudnnHandle_t handle() {
    if (!state.handle) {
        cudnnStatus_t st = cudnnCreate(&state.handle);
        if (st != CUDNN_STATUS_SUCCESS) fatal("cudnn attention: cudnnCreate failed: %s", cudnnGetErrorString(st));
    }
    return state.handle;
}

// (B, NH, T, hs) views. In qkv each of q, k, v is a C-wide slice of a 3C-wide row; in out,
// dout a row is C wide. The dims are cuDNN's logical order, the strides our memory's.
std::vector<int64_t> qkv_strides(int T, int NH, int hs) {
    int64_t row = 3LL * NH * hs;
    return {row * T, hs, row, 1};
}
std::vector<int64_t> btc_strides(int T, int NH, int hs) {
    int64_t row = (int64_t)NH * hs;
    return {row * T, hs, row, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> bhsd_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          const GraphKey& k, const std::vector<int64_t>& strides) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({k[0], k[2], k[1], k[3]})
                        .set_stride(strides));
}

// The stats: one fp32 per (b, h, t), (B,NH,T) contiguous.
fe::graph::Tensor_attributes& as_stats(fe::graph::Tensor_attributes& t, const GraphKey& k) {
    int64_t NH = k[2], T = k[1];
    return t.set_name("stats")
        .set_uid(UID_STATS)
        .set_dim({k[0], NH, T, 1})
        .set_stride({NH * T, T, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
}

// The scale travels by value at execution time, so one graph serves any scale.
std::shared_ptr<fe::graph::Tensor_attributes> scale_tensor(fe::graph::Graph& g) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("scale")
                        .set_uid(UID_SCALE)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_is_pass_by_value(true)
                        .set_data_type(fe::DataType_t::FLOAT));
}

void describe_forward(fe::graph::Graph& g, const GraphKey& k) {
    int T = k[1], NH = k[2], hs = k[3];
    auto q = bhsd_tensor(g, "q", UID_Q, k, qkv_strides(T, NH, hs));
    auto kk = bhsd_tensor(g, "k", UID_K, k, qkv_strides(T, NH, hs));
    auto v = bhsd_tensor(g, "v", UID_V, k, qkv_strides(T, NH, hs));
    // Causal: query t sees keys s <= t (the band's right bound 0 from the top-left diagonal).
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention_forward")
                       .set_generate_stats(true)
                       .set_attn_scale(scale_tensor(g))
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0);
    auto [o, stats] = g.sdpa(q, kk, v, options);
    o->set_output(true).set_uid(UID_O).set_dim({k[0], NH, T, hs}).set_stride(btc_strides(T, NH, hs));
    as_stats(*stats, k).set_output(true);
}

void describe_backward(fe::graph::Graph& g, const GraphKey& k) {
    int T = k[1], NH = k[2], hs = k[3];
    auto q = bhsd_tensor(g, "q", UID_Q, k, qkv_strides(T, NH, hs));
    auto kk = bhsd_tensor(g, "k", UID_K, k, qkv_strides(T, NH, hs));
    auto v = bhsd_tensor(g, "v", UID_V, k, qkv_strides(T, NH, hs));
    auto o = bhsd_tensor(g, "o", UID_O, k, btc_strides(T, NH, hs));
    auto dout = bhsd_tensor(g, "dout", UID_DO, k, btc_strides(T, NH, hs));
    fe::graph::Tensor_attributes stats_in;
    auto stats = g.tensor(as_stats(stats_in, k));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_attn_scale(scale_tensor(g))
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g.sdpa_backward(q, kk, v, o, dout, stats, options);
    int64_t uids[3] = {UID_DQ, UID_DK, UID_DV};
    std::shared_ptr<fe::graph::Tensor_attributes> grads[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        grads[i]->set_output(true).set_uid(uids[i]).set_dim({k[0], NH, T, hs}).set_stride(qkv_strides(T, NH, hs));
    }
}

// The workspace only grows; the old one may still be in use by queued work, so wait first.
void reserve_workspace(int64_t bytes) {
    if (bytes <= state.workspace_bytes) return;
    if (state.workspace) {
        check_cuda(cudaDeviceSynchronize(), "waiting before the workspace grows");
        check_cuda(cudaFree(state.workspace), "cudaFree(workspace)");
    }
    state.workspace = nullptr;
    check_cuda(cudaMalloc(&state.workspace, (size_t)bytes), "cudaMalloc(workspace)");
    state.workspace_bytes = bytes;
}

fe::graph::Graph& graph_for(const GraphKey& k) {
    auto found = state.graphs.find(k);
    if (found != state.graphs.end()) return *found->second;
    auto start = std::chrono::steady_clock::now();
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    if (k[4] == FORWARD) describe_forward(*g, k);
    else describe_backward(*g, k);
    check_fe(g->validate(), "validate", k);
    check_fe(g->build_operation_graph(handle()), "build_operation_graph", k);
    check_fe(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", k);
    check_fe(g->check_support(), "check_support", k);
    check_fe(g->build_plans(), "build_plans", k);
    int64_t bytes = 0;
    check_fe(g->get_workspace_size(bytes), "get_workspace_size", k);
    reserve_workspace(bytes);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // The memory check (run/memory_check.h) counted an estimate; say when cuDNN wants more.
    double estimate = gpt2_cudnn_workspace_estimate(k[0], k[1], (double)k[2] * k[3], k[2]);
    if (report_graphs) {
        printf("cudnn attention: %s graph for B=%d T=%d NH=%d hs=%d built in %.0f ms, workspace %.2f MiB\n",
               direction_name(k[4]), k[0], k[1], k[2], k[3], ms, bytes / 1048576.0);
        if (bytes > estimate) {
            fprintf(stderr, "cudnn attention: warning: the workspace (%.2f MiB) exceeds the %.2f MiB the memory "
                            "check counted\n", bytes / 1048576.0, estimate / 1048576.0);
        }
    }
    state.graphs[k] = g;
    return *g;
}

void execute(fe::graph::Graph& g, const GraphKey& k, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
    cudnnStatus_t st = cudnnSetStream(handle(), stream);
    if (st != CUDNN_STATUS_SUCCESS) fatal("cudnn attention: cudnnSetStream failed: %s", cudnnGetErrorString(st));
    check_fe(g.execute(handle(), pack, state.workspace), "execute", k);
    check_cuda(cudaGetLastError(), "after execute");
}

}  // namespace

void attention_forward_cudnn(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int NH, int hs,
                             float scale, cudaStream_t stream) {
    GraphKey k = {B, T, NH, hs, FORWARD};
    fe::graph::Graph& g = graph_for(k);
    size_t C = (size_t)NH * hs;
    __nv_bfloat16* in = const_cast<__nv_bfloat16*>(qkv);
    std::unordered_map<int64_t, void*> pack = {{UID_Q, in},          {UID_K, in + C}, {UID_V, in + 2 * C},
                                               {UID_SCALE, &scale},  {UID_O, out},    {UID_STATS, stats}};
    execute(g, k, pack, stream);
}

void attention_backward_cudnn(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const float* stats, int B, int T, int NH, int hs, float scale,
                              cudaStream_t stream) {
    GraphKey k = {B, T, NH, hs, BACKWARD};
    fe::graph::Graph& g = graph_for(k);
    size_t C = (size_t)NH * hs;
    __nv_bfloat16* in = const_cast<__nv_bfloat16*>(qkv);
    std::unordered_map<int64_t, void*> pack = {
        {UID_Q, in},           {UID_K, in + C},        {UID_V, in + 2 * C},
        {UID_O, const_cast<__nv_bfloat16*>(out)},      {UID_DO, const_cast<__nv_bfloat16*>(dout)},
        {UID_STATS, const_cast<float*>(stats)},        {UID_SCALE, &scale},
        {UID_DQ, dqkv},        {UID_DK, dqkv + C},     {UID_DV, dqkv + 2 * C}};
    execute(g, k, pack, stream);
}

void cudnn_attention_report(int on) { report_graphs = on; }

void cudnn_attention_free(void) {
    state.graphs.clear();
    if (state.workspace) check_cuda(cudaFree(state.workspace), "cudaFree(workspace)");
    if (state.handle) cudnnDestroy(state.handle);
    state = CudnnAttention();
}
