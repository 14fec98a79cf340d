// Sharded data parallelism (ZeRO stages 1, 2 and 3, docs/sharding.md) on CPU processes: memory per
// process against ZeRO's formula, and the step time against the unsharded optimizer with the
// allreduce overlapped, beside PyTorch DistributedDataParallel with Adam and with
// ZeroRedundancyOptimizer (stage 1) in the same run. Run it under mpiexec:
//
//   mpiexec -n 4 bench_mn_sharding [--params-m 100] [--width 2048] [--batch 8] [--steps 3]
//       [--warmup 1] [--communicator flat] [--bucket-mb 25] [--python python3] [--timeout 900]
//       [--no-peer]
//
// The model is a stack of Linear(width, width) layers with ReLU between them, as many as make
// about --params-m million parameters, trained with Adam in float32: unsharded (allreduce after
// backward, and overlapped), zero_stage 1, and zero_stage 2 with its reduce-scatter after backward
// and overlapped with it (the optimizer's `overlap`), and zero_stage 3 (the parameters sharded
// too, gathered in groups of --bucket-mb while used). Each variant runs in a phase
// of its own (its model and optimizer made, stepped, and freed before the next), one compute
// thread per process. Memory: the peak of the bytes CPU arrays asked for during the timed steps
// (kusari::cpu_memory_stats), less what was held before the phase, on the process that peaked
// highest - parameters, gradients, optimizer state, activations and communication buffers; beside
// it the model states counted (parameters + gradients at their peak + the optimizer's arrays) and
// ZeRO's formula for float32 Adam (Rajbhandari et al., 2020, with K = 8 bytes of state and 4-byte
// gradients): unsharded 16 Psi, stage 1 8 Psi + 8 Psi / N, stage 2 4 Psi + 12 Psi / N, stage 3
// 16 Psi / N. Time: the
// slowest process's step, the median over the steps. After kusari's phases, rank 0 runs
// bench/peers/zero_sharding.py (N processes of its own, gloo) while the other ranks sleep; its
// memory is glibc's bytes in use (mallinfo2) sampled after backward and after the step.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bench_mn_util.h"
#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
namespace mn = kusari::mn;
using kusari::bench::median_of;
using kusari::bench::now_seconds;

namespace {

class Stack : public kusari::Chain {
 public:
  Stack(int64_t width, int layers) {
    for (int i = 0; i < layers; ++i) {
      layers_.push_back(add_link("l" + std::to_string(i), std::make_shared<L::Linear>(width, width)));
    }
  }
  kusari::Variable forward(const kusari::Variable& x) override {
    kusari::Variable h = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = (*layers_[i])(h);
      if (i + 1 < layers_.size()) h = F::relu(h);
    }
    return h;
  }

 private:
  std::vector<std::shared_ptr<L::Linear>> layers_;
};

struct Phase {
  std::string name;
  int zero = 0;
  bool overlap = false;
  double step_ms = 0;
  double peak_bytes = 0;     // the highest process's
  double counted_bytes = 0;  // model states, the highest process's
  double formula_bytes = 0;
};

int64_t state_bytes(kusari::Optimizer& opt) {
  int64_t n = 0;
  for (kusari::ParamState& s : opt.param_states()) {
    for (auto& [name, a] : s.arrays) n += a.nbytes();
  }
  return n;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"ZeRO stages 1 and 2 on CPU processes: memory per process and step time, beside PyTorch"};
  double params_m = 100;
  int64_t width = 2048;
  int batch = 8, steps = 3, warmup = 1;
  double bucket_mb = 25;
  std::string name = "flat", python = "python3";
  bool no_peer = false;
  app.add_option("--params-m", params_m, "Parameters of the model, in millions (rounded to whole layers)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 100000.0));
  app.add_option("--width", width, "Width of each Linear layer")->capture_default_str()->check(CLI::Range(8, 65536));
  app.add_option("--batch", batch, "Examples per process per step")->capture_default_str()->check(CLI::Range(1, 65536));
  app.add_option("--steps", steps, "Timed steps per variant")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "Untimed steps first")->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_option("--communicator", name, "naive, flat (the CPU kinds)")->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "bucket_bytes in MiB: the overlapped allreduce's buckets, the sharded step's "
                 "chunks")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 65536.0));
  app.add_option("--python", python, "Interpreter of the PyTorch peer")->capture_default_str();
  app.add_flag("--no-peer", no_peer, "Skip the PyTorch peer");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mn_sharding")) return 0;

  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(1);
  auto comm = mn::create_communicator(name);
  const int rank = comm->rank(), nproc = comm->size();
  const int layers = std::max(1, static_cast<int>(params_m * 1e6 / static_cast<double>(width * width + width) + 0.5));
  const double psi = static_cast<double>(layers) * static_cast<double>(width * width + width);

  kusari::manual_seed(100 + static_cast<uint64_t>(rank));
  const kusari::Array x = kusari::Array::uniform({batch, width});
  const kusari::Array t = kusari::Array::uniform({batch, width});

  std::vector<Phase> phases = {{"unsharded, allreduce after backward", 0, false},
                               {"unsharded, allreduce overlapped", 0, true},
                               {"zero_stage 1", 1, false},
                               {"zero_stage 2, after backward", 2, false},
                               {"zero_stage 2, overlapped", 2, true},
                               {"zero_stage 3 (parameters too)", 3, true}};
  const double n = nproc;
  for (Phase& ph : phases) {
    ph.formula_bytes = ph.zero == 0   ? 16 * psi
                       : ph.zero == 1 ? 8 * psi + 8 * psi / n
                       : ph.zero == 2 ? 4 * psi + 12 * psi / n
                                      : 16 * psi / n;
    comm->barrier();
    kusari::cpu_empty_cache();
    const size_t before = kusari::cpu_memory_stats().requested_bytes;
    std::vector<double> times;
    double counted = 0;
    {
      // A communicator of the phase's own: what its reducers hold goes with it.
      auto phase_comm = mn::create_communicator(name);
      kusari::manual_seed(0);
      auto model = std::make_shared<Stack>(width, layers);
      mn::MultiNodeOptimizerOptions o;
      o.zero_stage = ph.zero;
      o.overlap = ph.overlap;
      o.bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
      auto opt = mn::create_multi_node_optimizer(std::make_shared<kusari::optimizers::Adam>(1e-4), phase_comm, o);
      opt->setup(model);
      int64_t param_bytes = model->count_params() * 4;
      for (int s = 0; s < warmup + 1 + steps; ++s) {  // (the first update only broadcasts)
        if (s == warmup + 1) kusari::reset_cpu_peak_memory_stats();
        comm->barrier();
        const double a = now_seconds();
        model->cleargrads();
        {
          kusari::Variable loss = F::mean_squared_error((*model)(kusari::Variable(x)), kusari::Variable(t));
          kusari::BackwardOptions bo;
          bo.retain_graph = false;
          loss.backward(bo);
        }
        int64_t grad_bytes = 0;  // (what backward left for the step)
        model->for_each_param([&](const kusari::Parameter& p) {
          if (p.grad().defined()) grad_bytes += p.grad().nbytes();
        });
        opt->update();
        const double took = comm->allreduce_obj(now_seconds() - a, mn::ReduceOp::kMax);
        if (s > warmup) times.push_back(took);
        if (ph.zero == 3) {  // (the shard's values, and the most held whole at once is not counted)
          param_bytes =
              dynamic_cast<mn::MultiNodeOptimizer&>(*opt).shard_stats().shard_elements * 4;
        }
        counted = static_cast<double>(param_bytes + grad_bytes + state_bytes(*opt));
      }
    }
    const double peak = static_cast<double>(kusari::cpu_memory_stats().peak_requested_bytes - before);
    ph.step_ms = median_of(times) * 1e3;
    ph.peak_bytes = comm->allreduce_obj(peak, mn::ReduceOp::kMax);
    ph.counted_bytes = comm->allreduce_obj(counted, mn::ReduceOp::kMax);
  }
  kusari::cpu_empty_cache();

  std::map<std::string, double> peer;
  if (rank == 0 && !no_peer) {
    peer = kusari::bench::try_peer(python, "zero_sharding.py",
                                   "--np " + std::to_string(nproc) + " --width " + std::to_string(width) +
                                       " --layers " + std::to_string(layers) + " --batch " + std::to_string(batch) +
                                       " --steps " + std::to_string(steps) + " --warmup " + std::to_string(warmup),
                                   "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1")
               .value_or(std::map<std::string, double>{});
  }
  kusari::bench::sleepy_barrier();
  if (rank != 0) return 0;

  const double mb = 1 << 20;
  std::printf("%d Linear(%lld, %lld) layers, %.1f M parameters (Psi), Adam float32, %d processes, batch %d per "
              "process, %s communicator, buckets / chunks of %.3g MiB, 1 compute thread each\n",
              layers, static_cast<long long>(width), static_cast<long long>(width), psi / 1e6, nproc, batch,
              name.c_str(), bucket_mb);
  std::printf("%-38s %10s %12s %12s %12s %8s\n", "kusari (MiB per process; ms)", "step ms", "peak MiB",
              "states MiB", "ZeRO MiB", "peak/ZeRO");
  for (const Phase& ph : phases) {
    std::printf("%-38s %10.0f %12.0f %12.0f %12.0f %8.2f\n", ph.name.c_str(), ph.step_ms, ph.peak_bytes / mb,
                ph.counted_bytes / mb, ph.formula_bytes / mb, ph.peak_bytes / ph.formula_bytes);
  }
  std::printf("step / unsharded overlapped step: stage 2 overlapped %.3f, after backward %.3f; stage 1 %.3f; "
              "stage 3 %.3f\n",
              phases[4].step_ms / phases[1].step_ms, phases[3].step_ms / phases[1].step_ms,
              phases[2].step_ms / phases[1].step_ms, phases[5].step_ms / phases[1].step_ms);
  if (!peer.empty()) {
    std::printf("%-38s %10s %12s %12s %8s\n", "pytorch (MiB per process; ms)", "step ms", "peak MiB", "ZeRO MiB",
                "peak/ZeRO");
    const double f0 = 16 * psi, f1 = 8 * psi + 8 * psi / n;
    std::printf("%-38s %10.0f %12.0f %12.0f %8.2f\n", "DDP + Adam (overlapped)", peer["ddp_ms"],
                peer["ddp_peak_bytes"] / mb, f0 / mb, peer["ddp_peak_bytes"] / f0);
    std::printf("%-38s %10.0f %12.0f %12.0f %8.2f\n", "DDP + ZeroRedundancyOptimizer(Adam)", peer["zero_ms"],
                peer["zero_peak_bytes"] / mb, f1 / mb, peer["zero_peak_bytes"] / f1);
    std::printf("ratio kusari / pytorch, step: unsharded overlapped %.3f, stage 1 %.3f; peak memory: unsharded %.3f, "
                "stage 1 %.3f\n",
                phases[1].step_ms / peer["ddp_ms"], phases[2].step_ms / peer["zero_ms"],
                phases[1].peak_bytes / peer["ddp_peak_bytes"], phases[2].peak_bytes / peer["zero_peak_bytes"]);
  }
  std::printf("reproduce: mpiexec -n %d %s\n", nproc, kusari::bench::command_line(argc, argv).c_str());
  for (const std::string& r : kusari::bench::incomplete_runs()) std::printf("incomplete: %s\n", r.c_str());
  return kusari::bench::incomplete_runs().empty() ? 0 : 1;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  try {
    rc = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mn_sharding: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
