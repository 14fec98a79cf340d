// Data-parallel throughput of the MNIST MLP (784-1000-1000-10, Adam, 100 samples per process
// per step) on this machine's CPUs: kusari under `mpiexec -n 2` (naive and flat communicators)
// against one kusari process using all cores, and against PyTorch DistributedDataParallel
// (gloo) with 2 processes and plain PyTorch in one process, all in the same run. Also the
// gradient allreduce time per step.
//
//   bench_mn_mnist [--python python3] [--np 2] [--iterations 50] [--timeout 600]
// (PyTorch DDP with gloo hung on the 2-core test machine in runs of 120 steps or more, and once at
// 50, so the default is 50 measured steps after 5 warm-up steps; a run that hangs is stopped after
// --timeout seconds and reported, Note [Runs with a time limit])
// (internally it re-runs itself with --worker, under mpiexec for the multi-process rows)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "bench_models.h"
#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;

namespace {

int worker(int iterations, int threads, const std::string& name) {
  // Kernels on one thread, BLAS on `threads` (the best setting of both frameworks on few cores).
  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(threads);
  auto comm = kusari::mn::create_communicator(name);
  kusari::manual_seed(static_cast<uint64_t>(comm->rank()));
  kusari::Array x = kusari::Array::uniform({100, 784});
  std::vector<int32_t> labels(100);
  for (int i = 0; i < 100; ++i) labels[static_cast<size_t>(i)] = i % 10;
  kusari::Array t = kusari::Array::from_vector(labels);
  auto model = std::make_shared<L::Classifier>(std::make_shared<kusari::bench::MnistMLP>());
  kusari::optimizers::Adam adam;
  adam.setup(model);
  comm->bcast_data(*model);
  auto step = [&]() {
    model->cleargrads();
    (*model)(kusari::Variable(x), t).backward();
    if (comm->size() > 1) comm->multi_node_mean_grad(*model, true);
    adam.update();
  };
  for (int i = 0; i < 5; ++i) step();
  comm->barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) step();
  comm->barrier();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The gradient path alone (pack + allreduce + unpack), all ranks starting together, as the
  // PyTorch peer measures its allreduce.
  double allreduce_ms = 0;
  if (comm->size() > 1) {
    comm->barrier();
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) comm->multi_node_mean_grad(*model, true);
    allreduce_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / 20 * 1e3;
  }
  if (comm->rank() == 0) {
    std::printf("RESULT samples_per_sec %f\n", iterations * 100.0 * comm->size() / seconds);
    std::printf("RESULT allreduce_ms %f\n", allreduce_ms);
  }
  return 0;
}

// Runs this program as a worker (under mpiexec when `prefix` says so), with the time limit.
std::optional<std::map<std::string, double>> run_self(const std::string& self, const std::string& prefix,
                                                      const std::string& args, const std::string& what) {
  return kusari::bench::try_run(prefix + " " + self + " --worker " + args, what);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel MNIST training on CPUs over MPI, kusari beside PyTorch DDP"};
  bool is_worker = false;
  std::string python = "python3", name = "naive";
  int np_count = 2, iterations = 50, threads = 1;
  app.add_flag("--worker", is_worker, "Run one training process (what the benchmark starts itself)");
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--np", np_count, "Processes of the data-parallel runs")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--iterations", iterations, "Training steps (a --worker run defaults to 200)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--threads", threads, "--worker: BLAS threads")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--communicator", name, "--worker: the communicator")
      ->capture_default_str()
      ->check(CLI::IsMember(kusari::mn::communicator_names()));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mn_mnist")) return 0;
  if (is_worker) return worker(app.count("--iterations") ? iterations : 200, threads, name);
  const std::string np = std::to_string(np_count);
  const std::string iters = std::to_string(iterations);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_proc = std::max(1, cores / std::stoi(np));
  std::string mpiexec = std::string(getuid() == 0 ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " : "") +
                        "mpiexec -n " + np + " --oversubscribe";
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[len > 0 ? len : 0] = '\0';

  std::printf("MNIST MLP data-parallel training on %d CPU cores, 100 samples per process per step\n", cores);
  std::printf("%-44s %14s %16s\n", "configuration", "samples/s", "allreduce ms");
  using kusari::bench::cell;
  const std::string one = "kusari, 1 process, BLAS x " + std::to_string(cores);
  std::optional<double> single;
  if (auto r = run_self(self, "", "--threads " + std::to_string(cores) + " --iterations " + iters, one)) {
    single = r->at("samples_per_sec");
  }
  std::printf("%-44s %14s %16s\n", one.c_str(), cell(single, 1).c_str(), "-");
  std::optional<double> best;
  for (const char* c : {"naive", "flat"}) {
    const std::string row = "kusari, mpiexec -n " + np + ", BLAS x " + std::to_string(per_proc) + ", " + c;
    std::optional<double> samples, allreduce;
    if (auto r = run_self(self, mpiexec,
                          std::string("--communicator ") + c + " --threads " + std::to_string(per_proc) +
                              " --iterations " + iters,
                          row)) {
      samples = r->at("samples_per_sec");
      allreduce = r->at("allreduce_ms");
      best = std::max(best.value_or(0.0), *samples);
    }
    std::printf("%-44s %14s %16s\n", row.c_str(), cell(samples, 1).c_str(), cell(allreduce).c_str());
  }
  std::optional<double> torch1;
  if (auto r = kusari::bench::try_peer(python, "ddp_mnist.py", "--np 1 --threads 1 --iterations " + iters,
                                       "OPENBLAS_NUM_THREADS=" + std::to_string(cores))) {
    torch1 = r->at("samples_per_sec");
  }
  std::printf("%-44s %14s %16s\n", ("pytorch, 1 process, BLAS x " + std::to_string(cores)).c_str(),
              cell(torch1, 1).c_str(), "-");
  std::optional<double> ddp, ddp_allreduce;
  if (auto r = kusari::bench::try_peer(python, "ddp_mnist.py", "--np " + np + " --threads 1 --iterations " + iters,
                                       "OPENBLAS_NUM_THREADS=" + std::to_string(per_proc))) {
    ddp = r->at("samples_per_sec");
    ddp_allreduce = r->at("allreduce_ms");
  }
  std::printf("%-44s %14s %16s\n",
              ("pytorch DDP (gloo), " + np + " processes, BLAS x " + std::to_string(per_proc)).c_str(),
              cell(ddp, 1).c_str(), cell(ddp_allreduce).c_str());
  std::optional<double> vs_ddp, vs_single;
  if (best && ddp) vs_ddp = *best / *ddp;
  if (best && single) vs_single = *best / *single;
  std::printf("ratio kusari (best of -n %s) / pytorch DDP = %s; kusari -n %s / kusari 1 process = %s\n", np.c_str(),
              cell(vs_ddp).c_str(), np.c_str(), cell(vs_single).c_str());
  return kusari::bench::finish(argc, argv);
}
