/*
 * The time of one NCCL collective, for gpt2_cost (dev/cost/gpt2_cost.c): steps x latency per
 * step + bytes / bus bandwidth, as NCCL's own tuning model counts them (NVIDIA/nccl,
 * src/graph/tuning.cc: ncclTopoTuneModel's latencies, then time = latency + bytes / bandwidth).
 * Plain C, header only.
 *
 * Placement: ranks fill nodes of P GPUs in rank order (P = --gpus-per-node; the launchers and
 * the instances' groups of consecutive ranks assume it). A group of ranks whose members all sit
 * in one node runs on NVLink; one that spans nodes runs at the InfiniBand bus bandwidth (a
 * ring is as fast as its slowest hop: a GPU's own NIC), its steps inside a node at NVLink's
 * latency and the hops between nodes at the network's.
 *
 * Steps (NCCL's nsteps and nInterSteps), n ranks over m nodes:
 *   ring reduce-scatter, all-gather: n-1 steps, m-1 of them between nodes (NCCL has no tree
 *     for these); bytes: what each rank sends, (n-1)/n of the buffer;
 *   ring all-reduce: 2(n-1) steps, 2(m-1) between nodes; bytes 2(n-1)/n of the buffer;
 *   tree all-reduce (--allreduce tree): up and down a chain inside each node and a tree
 *     across the nodes, 2((n/m - 1) intra + floor(log2 m) inter) steps; bytes 2 x the
 *     buffer (NCCL's tree algorithm bandwidth is half the bus bandwidth).
 * Latency per step, the Simple protocol (NCCL's choice for messages of megabytes, which every
 * bucket here is): tuning.cc's hwLat, as of the NCCL 2.2x releases: ring 3.4 us on NVLink,
 * 14 us over the network; tree 4 us and 14 us (--ring-latency-us, --tree-latency-us).
 * Not counted: NCCL's base latency per collective (8.4 us, Simple), its tree bandwidth
 * corrections, the SMs its kernels take from compute, and NVLS/CollNet (SHARP) algorithms.
 */
#ifndef LLMC_COMM_MODEL_H
#define LLMC_COMM_MODEL_H

#include <math.h>

enum { COST_LINK_NVLINK = 0, COST_LINK_IB = 1 };
enum { COST_ALGO_RING = 0, COST_ALGO_TREE = 1 };

// tuning.cc's hwLat[NVLINK|NET][TREE|RING][SIMPLE], us per step, by [algorithm][link].
static const double COST_NCCL_STEP_US[2][2] = {{3.4, 14.0}, {4.0, 14.0}};

typedef struct {
    double busbw_gbs[2];   // bus bandwidth (nccl-tests' busbw) by COST_LINK_*
    double step_us[2][2];  // latency per step by [COST_ALGO_*][COST_LINK_*]
    int gpus_per_node;     // P
    int allreduce_algo;    // COST_ALGO_*: the all-reduces' (reduce-scatter and all-gather are rings)
} CostNet;

// A group of n ranks (first, first + stride, ...) and the nodes it spans.
typedef struct {
    int n, nodes;
} CostGroup;

static inline CostGroup cost_group(const CostNet* net, int first, int stride, int n) {
    CostGroup g = {n, 0};
    int last_node = -1;
    for (int i = 0; i < n; i++) {  // node-major placement: the members' nodes only grow
        int node = (first + i * stride) / net->gpus_per_node;
        if (node != last_node) g.nodes++;
        last_node = node;
    }
    return g;
}

static inline double cost_group_busbw(const CostNet* net, CostGroup g) {
    return net->busbw_gbs[g.nodes > 1 ? COST_LINK_IB : COST_LINK_NVLINK] * 1e9;
}

// Latency of `steps` steps of algorithm a, `inter` of them between nodes.
static inline double cost_steps_s(const CostNet* net, int a, double steps, double inter) {
    return ((steps - inter) * net->step_us[a][COST_LINK_NVLINK] + inter * net->step_us[a][COST_LINK_IB]) * 1e-6;
}

// A ring reduce-scatter or all-gather in which each rank sends sent_bytes.
static inline double cost_ring_rs_ag_s(const CostNet* net, CostGroup g, double sent_bytes) {
    if (g.n < 2) return 0;
    return sent_bytes / cost_group_busbw(net, g) + cost_steps_s(net, COST_ALGO_RING, g.n - 1, g.nodes - 1);
}

// An all-reduce of buffer_bytes (ring: each rank sends 2(n-1)/n of it; tree: 2 x it).
static inline double cost_all_reduce_s(const CostNet* net, CostGroup g, double buffer_bytes) {
    if (g.n < 2) return 0;
    double bw = cost_group_busbw(net, g);
    if (net->allreduce_algo == COST_ALGO_TREE) {
        double depth = g.nodes > 1 ? floor(log2((double)g.nodes)) : 0;
        double intra = g.n / g.nodes - 1;  // NCCL: nRanks/nNodes, in integers
        return 2 * buffer_bytes / bw + cost_steps_s(net, COST_ALGO_TREE, 2 * (intra + depth), 2 * depth);
    }
    return 2.0 * (g.n - 1) / g.n * buffer_bytes / bw +
           cost_steps_s(net, COST_ALGO_RING, 2.0 * (g.n - 1), 2.0 * (g.nodes - 1));
}

#endif
