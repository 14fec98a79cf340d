// Gradient allreduce overlapped with backward on CPUs: the training step of ResNet-18 (kusari's
// models::resnet18, torchvision's layout, 11.7 M parameters) with the allreduce after backward
// and with overlap (create_multi_node_optimizer(..., {.overlap = true})), beside the same step
// without any communication and the allreduce alone, and the same four figures for PyTorch
// DistributedDataParallel (gloo) in the same run. Run it under mpiexec:
//
//   mpiexec -n 2 bench_mn_overlap [--batch 8] [--size 64] [--steps 10] [--warmup 2]
//       [--communicator flat] [--bucket-mb 25] [--first-bucket-mb 1] [--python python3]
//       [--timeout 600] [--no-peer] [--mpi-threads multiple|serialized]
//
// Each process trains on one thread, on the CPUs mpiexec binds it to (one core by default; with
// `--map-by slot:PE=2` two, the second free for MPI's progress thread). The three kusari steps are timed in turns (one of each per
// round, every rank starting together after a barrier; a step's time is the slowest rank's), so
// that they share the same minutes of a busy machine, and the figure is the median over the
// rounds. The communication a step shows is its time minus the step without communication of the
// same round (the median over the rounds); the share of it that overlap hides is
// 1 - shown(overlap) / shown(after backward). After kusari's
// rounds, rank 0 runs bench/peers/ddp_overlap.py (two processes of its own, gloo, bounded by
// --timeout, Note [Runs with a time limit] in bench_util.h) while the other ranks sleep; it prints
// the same rows for DDP (its default overlapped buckets of 25 MB; "after backward" is one allreduce
// of all gradients flattened, after backward).
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "bench_mn_util.h"
#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "kusari/models/resnet.h"

namespace F = kusari::functions;
namespace mn = kusari::mn;
using kusari::bench::median_of;
using kusari::bench::now_seconds;

int run(int argc, char** argv, bool multiple) {
  CLI::App app{
      "ResNet-18 data-parallel steps on CPUs: allreduce after backward vs overlapped, beside "
      "PyTorch DDP"};
  int batch = 8, size = 64, steps = 10, warmup = 2;
  double bucket_mb = 25, first_bucket_mb = 1;
  std::string name = "flat", python = "python3";
  bool no_peer = false;
  std::string threads_flag = "multiple";
  app.add_option("--mpi-threads", threads_flag,
                 "MPI's thread level: multiple (kusari's own level: a progress thread moves the "
                 "buckets on where a process has a core to spare, else the hooks; "
                 "KUSARI_MN_PROGRESS chooses) or serialized (the hooks do)")
      ->capture_default_str()
      ->check(CLI::IsMember({"multiple", "serialized"}));
  app.add_option("--batch", batch, "Images per process per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--size", size, "Image height and width")
      ->capture_default_str()
      ->check(CLI::Range(32, 1024));
  app.add_option("--steps", steps, "Timed rounds (one step of each kind per round)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "Untimed rounds first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--communicator", name, "naive, flat (the CPU kinds)")->capture_default_str();
  app.add_option("--bucket-mb", bucket_mb, "Bucket size in MiB")->capture_default_str();
  app.add_option("--first-bucket-mb", first_bucket_mb, "First bucket size in MiB")
      ->capture_default_str();
  app.add_option("--python", python, "Interpreter of the PyTorch peer")->capture_default_str();
  app.add_flag("--no-peer", no_peer, "Skip the PyTorch peer");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mn_overlap")) return 0;
  if (multiple != (threads_flag == "multiple")) return 2;  // (main initialised MPI from argv)

  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(1);
  // The CPUs mpiexec bound this process to (the progress thread shares them).
  cpu_set_t bound;
  const int cpus = ::sched_getaffinity(0, sizeof(bound), &bound) == 0 ? CPU_COUNT(&bound) : 0;
  auto comm_off = mn::create_communicator(name);
  auto comm_on = mn::create_communicator(name);
  const int rank = comm_off->rank(), nproc = comm_off->size();

  // Three copies of the model: allreduce after backward, overlapped, and no communication.
  kusari::manual_seed(0);
  auto model_off = kusari::models::resnet18();
  kusari::manual_seed(0);
  auto model_on = kusari::models::resnet18();
  kusari::manual_seed(0);
  auto model_local = kusari::models::resnet18();
  auto opt_off = mn::create_multi_node_optimizer(
      std::make_shared<kusari::optimizers::MomentumSGD>(0.01, 0.9), comm_off);
  mn::MultiNodeOptimizerOptions options;
  options.overlap = true;
  options.bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
  options.first_bucket_bytes = static_cast<int64_t>(first_bucket_mb * (1 << 20));
  auto opt_on = mn::create_multi_node_optimizer(
      std::make_shared<kusari::optimizers::MomentumSGD>(0.01, 0.9), comm_on, options);
  kusari::optimizers::MomentumSGD opt_local(0.01, 0.9);
  opt_off->setup(model_off);
  opt_on->setup(model_on);
  opt_local.setup(model_local);

  kusari::manual_seed(100 + static_cast<uint64_t>(rank));
  const kusari::Array x = kusari::Array::uniform({batch, 3, size, size});
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = (i * 37 + rank) % 1000;
  const kusari::Array t = kusari::Array::from_vector(labels);
  auto step = [&](kusari::Link& model, kusari::Optimizer& opt) {
    model.cleargrads();
    kusari::Variable loss = F::softmax_cross_entropy(model(kusari::Variable(x)), t);
    loss.backward();
    loss = kusari::Variable();
    opt.update();
  };
  // The slowest rank's seconds of f, every rank starting together.
  auto timed = [&](const std::function<void()>& f) {
    comm_off->barrier();
    const double a = now_seconds();
    f();
    return comm_off->allreduce_obj(now_seconds() - a, mn::ReduceOp::kMax);
  };
  std::vector<double> t_off, t_on, t_local, t_allreduce, t_in_backward, t_waiting;
  auto& overlapped = dynamic_cast<mn::MultiNodeOptimizer&>(*opt_on);
  for (int round = 0; round < warmup + steps; ++round) {
    const double off = timed([&] { step(*model_off, *opt_off); });
    const double on = timed([&] { step(*model_on, *opt_on); });
    const mn::OverlapStats st = overlapped.overlap_stats();
    const double in_backward = comm_off->allreduce_obj(st.seconds_in_backward, mn::ReduceOp::kMax);
    const double waiting = comm_off->allreduce_obj(st.seconds_waiting, mn::ReduceOp::kMax);
    const double local = timed([&] { step(*model_local, opt_local); });
    const double allreduce = timed([&] { comm_off->multi_node_mean_grad(*model_off, true); });
    if (round < warmup) continue;
    t_off.push_back(off);
    t_on.push_back(on);
    t_local.push_back(local);
    t_allreduce.push_back(allreduce);
    t_in_backward.push_back(in_backward);
    t_waiting.push_back(waiting);
  }
  const mn::OverlapStats stats = overlapped.overlap_stats();
  const double off = median_of(t_off) * 1e3, on = median_of(t_on) * 1e3, local = median_of(t_local) * 1e3,
               allreduce = median_of(t_allreduce) * 1e3;

  std::map<std::string, double> peer;
  if (rank == 0 && !no_peer) {
    // (a peer that fails or hangs is stopped at --timeout; its rows are then "-")
    peer = kusari::bench::try_peer(
               python, "ddp_overlap.py",
               "--np " + std::to_string(nproc) + " --batch " + std::to_string(batch) + " --size " +
                   std::to_string(size) + " --steps " + std::to_string(steps) + " --warmup " +
                   std::to_string(warmup) + " --bucket-mb " + std::to_string(bucket_mb),
               "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1")
               .value_or(std::map<std::string, double>{});
  }
  kusari::bench::sleepy_barrier();
  if (rank != 0) return 0;

  // What a step shows is taken round by round (the step minus the step without communication of
  // the same round, whose minutes of the machine it shares), then the median over the rounds.
  std::vector<double> d_off, d_on;
  for (size_t i = 0; i < t_off.size(); ++i) {
    d_off.push_back(t_off[i] - t_local[i]);
    d_on.push_back(t_on[i] - t_local[i]);
  }
  const double shown_off = median_of(d_off) * 1e3, shown_on = median_of(d_on) * 1e3;
  std::printf(
      "ResNet-18, %d processes, batch %d per process, 3x%dx%d, 1 compute thread each on %d "
      "CPU(s) (the peer's workers bound alike); %s communicator, "
      "buckets of %.3g MiB (first %.3g MiB): %d buckets, %d sent during backward; MPI_THREAD_%s, "
      "%s\n",
      nproc, batch, size, size, cpus, name.c_str(), bucket_mb, first_bucket_mb, stats.buckets,
      stats.launched_in_backward, multiple ? "MULTIPLE" : "SERIALIZED",
      !stats.progress_thread ? "the hooks move the collectives on"
      : stats.progress_yields
          ? "a progress thread moves the collectives on, yielding between tests"
          : "a progress thread moves the collectives on, sleeping between tests");
  std::printf("%-44s %12s %12s\n", "median of the rounds, ms", "kusari", "pytorch");
  auto row = [&](const char* what, double k, const char* key) {
    if (peer.count(key)) {
      std::printf("%-44s %12.1f %12.1f\n", what, k, peer[key]);
    } else {
      std::printf("%-44s %12.1f %12s\n", what, k, "-");
    }
  };
  row("step without communication", local, "local_ms");
  row("step, allreduce after backward", off, "off_ms");
  row("step, allreduce overlapped with backward", on, "on_ms");
  row("allreduce of all gradients alone", allreduce, "allreduce_ms");
  const double hidden = shown_off > 0 ? 1.0 - shown_on / shown_off : 0.0;
  std::printf("communication shown by the step: after backward %.1f ms, overlapped %.1f ms\n",
              shown_off, shown_on);
  std::printf(
      "overlapped: %.1f ms inside the collectives during backward, %.1f ms waiting in the update "
      "(slowest rank, median)\n",
      median_of(t_in_backward) * 1e3, median_of(t_waiting) * 1e3);
  std::printf("kusari: overlap hides %.0f%% of the communication the step shows without it\n",
              100 * hidden);
  if (peer.count("on_ms")) {
    const double p_off = peer["shown_off_ms"], p_on = peer["shown_on_ms"];
    std::printf("pytorch DDP: overlap hides %.0f%% (after backward %.1f ms, overlapped %.1f ms)\n",
                p_off > 0 ? 100 * (1.0 - p_on / p_off) : 0.0, p_off, p_on);
    std::printf("ratio kusari / pytorch, overlapped step: %.3f; step without communication: %.3f\n",
                on / peer["on_ms"], local / peer["local_ms"]);
  }
  std::printf("reproduce: mpiexec -n %d %s\n", nproc,
              kusari::bench::command_line(argc, argv).c_str());
  for (const std::string& run : kusari::bench::incomplete_runs()) {
    std::printf("incomplete: %s\n", run.c_str());
  }
  return kusari::bench::incomplete_runs().empty() ? 0 : 1;
}

int main(int argc, char** argv) {
  // The thread level is chosen before kusari would initialise MPI (with its own level,
  // MPI_THREAD_MULTIPLE).
  bool multiple = true;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--mpi-threads")
      multiple = std::string(argv[i + 1]) != "serialized";
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided);
  int rc = 0;
  try {
    rc = run(argc, argv, multiple);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mn_overlap: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
