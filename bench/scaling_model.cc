// An alpha-beta cost model of one data-parallel training step, and what it predicts for ResNet-50
// on 8 to 1024 GPUs (docs/scaling.md explains the model, its calibration and its sources).
//
//   bench_scaling_model                      the three published runs, then kusari on H200 nodes
//   bench_scaling_model --machine h200-ndr --step-ms 52.6 --batch 256 --wire-bytes 2 \
//       --gpus 8,64,256,1024 [--no-overlap] [--bucket-mb 25]
//
// Note [The scaling model]
// A step on p GPUs is the compute of one GPU at its batch b (forward + backward + update,
// measured on one GPU) plus the part of the gradient allreduce that is not hidden behind the
// backward pass. The allreduce of n bytes over p GPUs in nodes of g, each node with a network
// bandwidth B and a per-message latency alpha, costs
//   ring: 2 (p - 1) alpha + 2 (p - 1) / p * n / min(B, B_intra)   (pipelined through every GPU)
//   tree: 2 log2(p / g) alpha + 2 n / B + intra                     (NCCL's double binary tree)
//   2-d torus (X x Y GPUs): 2 (X - 1 + Y - 1) alpha + 2 n / B + intra   (Sony's)
// where intra = 2 (g - 1) / g * n / B_intra is the reduce-scatter and all-gather inside a node. The cheaper of the algorithms the machine
// offers is taken per message, as NCCL does. With overlap the gradients travel in buckets of s
// bytes, launched in turn as backward (two thirds of the compute) makes them ready, and only what
// is left after backward ends is exposed; without it the allreduce follows backward whole.
// Scaling efficiency = compute / step.
//
// Sharded data parallelism (--zero, docs/sharding.md) moves other collectives. A reduce-scatter
// or an all-gather of n bytes is half an allreduce: (p - 1) alpha + (p - 1) / p * n / B on the
// ring (NCCL runs both on rings only). Per step, with n the bytes of all parameters (the
// gradients have as many):
//   stage 1 (kusari's): the allreduce of the gradients, then an all-gather of the updated
//            parameters after the step, exposed: 1.5 allreduces of volume;
//   stage 2: a reduce-scatter of the gradients (after backward in kusari's version; overlapped
//            in buckets with --overlap, as ZeRO-2 does), then the all-gather: 1 allreduce;
//   stage 3: the parameters all-gathered layer by layer before forward and again before
//            backward, the gradients reduce-scattered during backward: 1.5 allreduces, hidden
//            behind forward (one third of the compute) and backward (two thirds) but for what
//            exceeds them, and the first layer's gather, which nothing hides.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kusari/core/program.h"

namespace {

struct Machine {
  std::string name, what;
  int gpus_per_node;
  double node_gbytes_s;    // effective network bandwidth of a node (GB/s)
  double nvlink_gbytes_s;  // effective intra-node bus bandwidth (GB/s)
  double alpha_us;         // latency per message step across nodes
  bool torus;              // a 2-d torus allreduce (Sony's) instead of NCCL's ring/tree
  bool tree;               // NCCL's tree is available
};

// Effective bandwidths are about 85% of the links' rate (what nccl-tests reach on such links).
const std::vector<Machine>& machines() {
  static const std::vector<Machine> m = {
      {"mn1-p100", "MN-1: 8 P100 (PCIe) per node, 2 x InfiniBand FDR 56 Gb/s per node", 8, 2 * 56 / 8.0 * 0.85,
       10.0, 10.0, false, false},
      {"abci-v100", "ABCI: 4 V100 (NVLink) per node, 2 x InfiniBand EDR 100 Gb/s per node", 4,
       2 * 100 / 8.0 * 0.85, 130.0, 5.0, true, false},
      {"h200-ndr", "8 H200 (NVLink 4, NVSwitch) per node, 8 x InfiniBand NDR 400 Gb/s per node", 8,
       8 * 400 / 8.0 * 0.85, 450.0, 5.0, false, true},
  };
  return m;
}

double allreduce_ms(const Machine& m, double bytes, int p) {
  const int g = std::min(p, m.gpus_per_node);
  const int nodes = std::max(1, p / g);
  const double intra = g > 1 ? 2.0 * (g - 1) / g * bytes / (m.nvlink_gbytes_s * 1e9) : 0.0;
  if (nodes == 1) return intra * 1e3 + 2.0 * (g - 1) * 2e-3;  // NVLink steps of ~2 us
  const double alpha = m.alpha_us * 1e-6, beta = 1.0 / (m.node_gbytes_s * 1e9);
  // The flat ring pipelines through every GPU: the slowest link (a GPU's share of its node's
  // network, or its intra-node link) sets the pace. The hierarchical schemes (tree, torus) add an
  // intra-node reduce-scatter and all-gather to the inter-node part.
  const double slowest = std::min(m.nvlink_gbytes_s, m.node_gbytes_s) * 1e9;
  double t = 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * bytes / slowest;  // ring
  if (m.tree) t = std::min(t, intra + 2.0 * std::log2(nodes) * alpha + 2.0 * bytes * beta);
  if (m.torus) {
    const int x = static_cast<int>(std::lround(std::sqrt(static_cast<double>(p))));
    const int y = (p + x - 1) / x;
    t = std::min(t, intra + 2.0 * (x - 1 + y - 1) * alpha + 2.0 * bytes * beta);
  }
  return t * 1e3;
}

/// A reduce-scatter or an all-gather of `bytes` (the whole buffer) over p GPUs: half of a ring allreduce.
double gather_ms(const Machine& m, double bytes, int p) {
  const int g = std::min(p, m.gpus_per_node);
  const int nodes = std::max(1, p / g);
  if (nodes == 1) return (g > 1 ? (g - 1.0) / g * bytes / (m.nvlink_gbytes_s * 1e9) * 1e3 : 0.0) + (g - 1) * 2e-3;
  const double slowest = std::min(m.nvlink_gbytes_s, m.node_gbytes_s) * 1e9;
  return ((p - 1) * m.alpha_us * 1e-6 + (p - 1.0) / p * bytes / slowest) * 1e3;
}

struct Step {
  double step_ms, exposed_ms, efficiency;
};

/// What is left of `comm_ms` of collectives queued as `compute_ms` of work makes them ready, in
/// `pieces` equal parts (a part's collective starts when its share of the work is done).
double exposed_after(double compute_ms, double comm_ms, int pieces) {
  double done = 0;
  for (int i = 1; i <= pieces; ++i) done = std::max(done, compute_ms * i / pieces) + comm_ms / pieces;
  return std::max(0.0, done - compute_ms);
}

/// A step with the optimizer sharded (stage 1, 2 or 3; see the Note).
Step zero_step(const Machine& m, double compute_ms, double bytes, int p, int stage, bool overlap, double bucket_bytes,
               double sync_ms) {
  if (p == 1) return {compute_ms, 0, 1};
  const double forward_ms = compute_ms / 3.0, backward_ms = compute_ms * 2.0 / 3.0;
  const int buckets = std::max(1, static_cast<int>(std::ceil(bytes / bucket_bytes)));
  const double gather = gather_ms(m, bytes, p);
  double exposed = 0;
  if (stage == 1) {
    exposed = allreduce_ms(m, bytes, p) + gather;
  } else if (stage == 2) {
    const double scatter = gather_ms(m, bytes, p);
    exposed = (overlap ? exposed_after(backward_ms, scatter, buckets) : scatter) + gather;
  } else {
    // Forward: the gathers run a layer ahead; backward: gathers and reduce-scatters.
    const double first = gather_ms(m, std::min(bytes, bucket_bytes), p);
    exposed = first + exposed_after(forward_ms, gather, buckets) +
              exposed_after(backward_ms, gather + gather_ms(m, bytes, p), buckets);
  }
  exposed += sync_ms;
  const double step = compute_ms + exposed;
  return {step, exposed, compute_ms / step};
}

Step model_step(const Machine& m, double compute_ms, double grad_bytes, int p, bool overlap,
                double bucket_bytes, double sync_ms) {
  if (p == 1) return {compute_ms, 0, 1};
  const double backward_ms = compute_ms * 2.0 / 3.0;
  double exposed = 0;
  if (!overlap) {
    exposed = allreduce_ms(m, grad_bytes, p);
  } else {
    const int buckets = std::max(1, static_cast<int>(std::ceil(grad_bytes / bucket_bytes)));
    double done = 0;  // when the communication stream finishes the buckets so far (ms into backward)
    for (int i = 1; i <= buckets; ++i) {
      const double ready = backward_ms * i / buckets;
      const double bytes = std::min(bucket_bytes, grad_bytes - bucket_bytes * (i - 1));
      done = std::max(done, ready) + allreduce_ms(m, bytes, p);
    }
    exposed = std::max(0.0, done - backward_ms);
  }
  exposed += sync_ms;
  const double step = compute_ms + exposed;
  return {step, exposed, compute_ms / step};
}

const Machine& find_machine(const std::string& name) {
  for (const Machine& m : machines()) {
    if (m.name == name) return m;
  }
  std::string names;
  for (const Machine& m : machines()) names += (names.empty() ? "" : ", ") + m.name;
  std::fprintf(stderr, "bench_scaling_model: --machine: unknown machine '%s' (expected one of %s)\n",
               name.c_str(), names.c_str());
  std::exit(2);
}

void table(const Machine& m, double compute_ms, int batch, double grad_bytes, const std::vector<int>& gpus,
           bool overlap, double bucket_bytes, double sync_ms = 0) {
  constexpr double kImagesPer90Epochs = 90 * 1281167.0;
  std::printf("%s; compute %.1f ms per step at batch %d per GPU; gradients %.1f MB on the wire; %s\n",
              m.what.c_str(), compute_ms, batch, grad_bytes / 1e6,
              overlap ? "bucketed overlap with backward" : "allreduce after backward");
  std::printf("%6s %10s %12s %10s %12s %14s\n", "GPUs", "step ms", "exposed ms", "scaling", "img/s", "90 epochs");
  for (int p : gpus) {
    const Step s = model_step(m, compute_ms, grad_bytes, p, overlap, bucket_bytes, sync_ms);
    const double img_s = p * batch / (s.step_ms * 1e-3);
    const double minutes = kImagesPer90Epochs / img_s / 60.0;
    std::printf("%6d %10.2f %12.2f %9.1f%% %12.0f %11.1f min\n", p, s.step_ms, s.exposed_ms,
                100 * s.efficiency, img_s, minutes);
  }
  std::printf("\n");
}

/// ZeRO stages 0-3 side by side: the scaling efficiency of each.
void zero_table(const Machine& m, double compute_ms, double bytes, const std::vector<int>& gpus, double bucket_bytes,
                double sync_ms) {
  std::printf("%s; compute %.1f ms per step; parameters %.2f GB on the wire; buckets of %.0f MB\n", m.what.c_str(),
              compute_ms, bytes / 1e9, bucket_bytes / 1e6);
  std::printf("%6s %12s %12s %12s %12s %12s\n", "GPUs", "replicated", "stage 1", "stage 2", "stage 2 ovl",
              "stage 3");
  for (int p : gpus) {
    const double r = model_step(m, compute_ms, bytes, p, true, bucket_bytes, sync_ms).efficiency;
    const double z1 = zero_step(m, compute_ms, bytes, p, 1, false, bucket_bytes, sync_ms).efficiency;
    const double z2 = zero_step(m, compute_ms, bytes, p, 2, false, bucket_bytes, sync_ms).efficiency;
    const double z2o = zero_step(m, compute_ms, bytes, p, 2, true, bucket_bytes, sync_ms).efficiency;
    const double z3 = zero_step(m, compute_ms, bytes, p, 3, true, bucket_bytes, sync_ms).efficiency;
    std::printf("%6d %11.1f%% %11.1f%% %11.1f%% %11.1f%% %11.1f%%\n", p, 100 * r, 100 * z1, 100 * z2, 100 * z2o,
                100 * z3);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kusari: an alpha-beta model of data-parallel ResNet-50 training (docs/scaling.md)"};
  std::string machine;
  double step_ms = 0, bucket_mb = 25, wire_bytes = 2;
  int batch = 256;
  std::vector<int> gpus = {8, 64, 256, 1024};
  bool no_overlap = false;
  double sync_ms = 0;
  constexpr double kResNet50Params = 25557032;
  app.add_option("--machine", machine, "mn1-p100, abci-v100 or h200-ndr (default: the published runs, then h200-ndr)");
  app.add_option("--step-ms", step_ms, "Measured one-GPU step (forward, backward, update) in ms");
  app.add_option("--batch", batch, "Batch per GPU")->capture_default_str();
  app.add_option("--gpus", gpus, "GPU counts")->delimiter(',');
  app.add_option("--wire-bytes", wire_bytes, "Bytes per gradient on the wire (4 float32, 2 float16/bfloat16)")
      ->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "Bucket size of the overlapped allreduce (MB)")->capture_default_str();
  app.add_flag("--no-overlap", no_overlap, "Reduce after backward (ChainerMN's way)");
  app.add_option("--sync-ms", sync_ms,
                 "A fixed cost per step on more than one GPU (synchronisation, stragglers, NCCL kernels "
                 "sharing the multiprocessors with backward), calibrated from a measured 2-GPU run")
      ->capture_default_str();
  double params = kResNet50Params;
  bool zero = false;
  app.add_option("--params", params, "Parameters of the model (default ResNet-50's)")->capture_default_str();
  app.add_flag("--zero", zero, "Compare the ZeRO stages (docs/sharding.md) instead of the ImageNet table");
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_scaling_model")) return 0;
  const double grad_bytes = params * wire_bytes;
  if (!machine.empty()) {
    if (step_ms <= 0) {
      std::fprintf(stderr, "bench_scaling_model: --machine needs --step-ms (the measured one-GPU step)\n");
      return 2;
    }
    if (zero) {
      zero_table(find_machine(machine), step_ms, grad_bytes, gpus, bucket_mb * 1e6, sync_ms);
    } else {
      table(find_machine(machine), step_ms, batch, grad_bytes, gpus, !no_overlap, bucket_mb * 1e6, sync_ms);
    }
    return 0;
  }
  // The published runs (docs/scaling.md cites them), with their own one-GPU compute estimates.
  std::printf("== published runs (prediction against the reported scaling)\n");
  std::printf("PFN, 15 minutes (1024 P100, batch 32 per GPU, float16 allreduce after backward): reported 80%%\n");
  table(find_machine("mn1-p100"), 32 / 230.0 * 1e3, 32, kResNet50Params * 2, {1024}, false, 25e6);
  std::printf("ChainerMN paper (128 P100, batch 32 per GPU, float32 allreduce after backward): reported 90%%\n");
  table(find_machine("mn1-p100"), 32 / 230.0 * 1e3, 32, kResNet50Params * 4, {128}, false, 25e6);
  std::printf("Sony, 224 s (1088 V100, batch 32 per GPU, float16, 2-d torus, overlapped): reported 91.62%%\n");
  table(find_machine("abci-v100"), 32 / 1000.0 * 1e3, 32, kResNet50Params * 2, {1088}, true, 25e6);
  std::printf("== kusari, bfloat16 channels-last, batch 256 per GPU (one H200: 52.6 ms, docs/benchmarks.md)\n");
  table(find_machine("h200-ndr"), 52.6, 256, kResNet50Params * 2, gpus, true, bucket_mb * 1e6);
  table(find_machine("h200-ndr"), 52.6, 256, kResNet50Params * 2, gpus, false, bucket_mb * 1e6);
  std::printf("== the same with the 2.1 ms per step that PyTorch DDP's 96%% on two H200s implies (--sync-ms 2.1)\n");
  table(find_machine("h200-ndr"), 52.6, 256, kResNet50Params * 2, gpus, true, bucket_mb * 1e6, 2.1);
  std::printf("== ZeRO stages, GPT-2 XL (1.56 B parameters, bfloat16 on the wire), 8 sequences of 1024 tokens per "
              "GPU:\n   compute 6 x 1.56e9 x 8192 FLOP at 400 TFLOP/s = 192 ms (an assumption, not a measurement)\n");
  zero_table(find_machine("h200-ndr"), 192, 1.558e9 * 2, gpus, bucket_mb * 1e6, 0);
  std::printf("== the same at 1 sequence per GPU (24 ms of compute)\n");
  zero_table(find_machine("h200-ndr"), 24, 1.558e9 * 2, gpus, bucket_mb * 1e6, 0);
  std::printf("reproduce: bench_scaling_model\n");
  return 0;
}
