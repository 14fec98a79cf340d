// The cost of one small collective on CPUs: kusari's allreduce_obj (one double), barrier and
// bcast_obj (8 bytes) under mpiexec, each with its deadline (non-blocking MPI polled by wait_requests:
// Note [Deadline on every collective]), against the same operation as one blocking MPI call
// (what kusari did before the deadline) timed in turns in the same processes, and against
// PyTorch's gloo (all_reduce of one float64, barrier, broadcast of 8 bytes) with as many processes.
//
//   bench_mn_collectives [--python python3] [--np 2] [--repeats 2000] [--timeout seconds]
// (internally it re-runs itself with --worker under mpiexec)
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace {

using Clock = std::chrono::steady_clock;

/// Microseconds per call of `f` over `repeats` calls, every rank starting together.
double per_call_us(const std::function<void()>& f, int repeats) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double>(Clock::now() - start).count() / repeats * 1e6;
}

int worker(int repeats) {
  auto comm = kusari::mn::create_communicator("naive");
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const kusari::mn::Bytes eight(8, 1);
  double value = 1.0;
  uint8_t bytes[8] = {};
  struct Op {
    const char* name;
    std::function<void()> kusari, mpi;
  };
  const std::vector<Op> ops = {
      {"allreduce", [&] { comm->allreduce_obj(1.0); },
       [&] { MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, raw); }},
      {"barrier", [&] { comm->barrier(); }, [&] { MPI_Barrier(raw); }},
      {"bcast", [&] { comm->bcast_obj(eight, 0); },
       [&] { MPI_Bcast(bytes, 8, MPI_BYTE, 0, raw); }},
  };
  // Five rounds, kusari and raw MPI in turns; the median round of each.
  for (const Op& op : ops) {
    std::vector<double> k, m;
    for (int round = 0; round < 5; ++round) {
      k.push_back(per_call_us(op.kusari, repeats));
      m.push_back(per_call_us(op.mpi, repeats));
    }
    std::sort(k.begin(), k.end());
    std::sort(m.begin(), m.end());
    if (comm->rank() == 0) {
      std::printf("RESULT kusari_%s_us %f\n", op.name, k[2]);
      std::printf("RESULT mpi_%s_us %f\n", op.name, m[2]);
    }
  }
  MPI_Comm_free(&raw);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Small collectives on CPUs: kusari (with its deadline) beside blocking MPI and gloo"};
  bool is_worker = false;
  std::string python = "python3";
  int np_count = 2, repeats = 2000;
  app.add_flag("--worker", is_worker, "Run one process of the kusari job (what the benchmark starts itself)");
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--np", np_count, "Processes")->capture_default_str()->check(CLI::Range(2, 1 << 30));
  app.add_option("--repeats", repeats, "Calls per timing")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mn_collectives")) return 0;
  if (is_worker) return worker(repeats);

  const std::string np = std::to_string(np_count);
  const std::string mpiexec =
      std::string(getuid() == 0 ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " : "") +
      "mpiexec -n " + np + " --oversubscribe";
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[len > 0 ? len : 0] = '\0';
  const auto ours = kusari::bench::try_run(
      mpiexec + " " + self + " --worker --repeats " + std::to_string(repeats), "kusari and MPI (mpiexec -n " + np + ")");
  const auto gloo = kusari::bench::try_peer(python, "collectives.py",
                                            "--np " + np + " --repeats " + std::to_string(repeats));

  using kusari::bench::cell;
  std::printf("Small collectives, %s processes on %u CPU cores, microseconds per call (median of 5 rounds)\n",
              np.c_str(), std::max(1u, std::thread::hardware_concurrency()));
  std::printf("%-10s %12s %14s %12s %12s %12s\n", "operation", "kusari", "blocking MPI", "gloo",
              "kusari/MPI", "gloo/kusari");
  for (const char* op : {"allreduce", "barrier", "bcast"}) {
    auto get = [](const std::optional<std::map<std::string, double>>& r,
                  const std::string& key) -> std::optional<double> {
      if (!r || !r->count(key)) return std::nullopt;
      return r->at(key);
    };
    const auto k = get(ours, std::string("kusari_") + op + "_us");
    const auto m = get(ours, std::string("mpi_") + op + "_us");
    const auto g = get(gloo, std::string(op) + "_us");
    std::optional<double> km, kg;
    if (k && m) km = *k / *m;
    if (k && g) kg = *g / *k;
    std::printf("%-10s %12s %14s %12s %12s %12s\n", op, cell(k, 2).c_str(), cell(m, 2).c_str(),
                cell(g, 2).c_str(), cell(km, 2).c_str(), cell(kg, 0).c_str());
  }
  return kusari::bench::finish(argc, argv);
}
