// Per-op overhead: small elementwise ops (8 elements) recorded for autograd, in microseconds per
// op, against PyTorch's eager Python path doing the same ops.
//
//   bench_op_overhead [--python python3] [--chains 2000]
#include <cstdio>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;

int main(int argc, char** argv) {
  CLI::App app{"Per-operation overhead of small ops, kusari beside PyTorch"};
  std::string python = "python3";
  int chains = 2000;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--chains", chains, "Length of the chain of small operations")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_op_overhead")) return 0;
  constexpr int kLength = 100;  // ops per chain: 50 x (mul, add)
  kusari::set_num_threads(1);
  kusari::Variable x(kusari::Array::uniform({8}), true);
  kusari::Variable w(kusari::Array::uniform({8}), true);
  auto run_chain = [&]() {
    kusari::Variable y = x;
    for (int i = 0; i < kLength / 2; ++i) y = y * w + x;
    return y;
  };
  double fwd = kusari::bench::median_seconds(
      [&]() {
        for (int c = 0; c < chains / 10; ++c) run_chain();
      },
      10);
  double per_op_fwd = fwd / (chains / 10 * kLength) * 1e6;
  double fwd_bwd = kusari::bench::median_seconds(
      [&]() {
        for (int c = 0; c < chains / 10; ++c) {
          kusari::Variable y = F::sum(run_chain());
          y.backward();
        }
      },
      10);
  double per_op_fwd_bwd = fwd_bwd / (chains / 10 * kLength) * 1e6;

  std::printf("per-op overhead, 8-element float32 ops recorded for autograd (1 thread)\n");
  auto peer = kusari::bench::try_peer(python, "op_overhead.py", "--chains " + std::to_string(chains));
  auto peer_us = [&](const char* key) -> std::optional<double> {
    if (peer) return peer->at(key);
    return std::nullopt;
  };
  auto ratio = [](double ours, std::optional<double> theirs) -> std::optional<double> {
    if (theirs) return ours / *theirs;
    return std::nullopt;
  };
  std::printf("%-34s %12s %12s %8s\n", "", "kusari us", "pytorch us", "ratio");
  std::printf("%-34s %12.3f %12s %8s\n", "forward, per op", per_op_fwd,
              kusari::bench::cell(peer_us("forward_us")).c_str(),
              kusari::bench::cell(ratio(per_op_fwd, peer_us("forward_us"))).c_str());
  std::printf("%-34s %12.3f %12s %8s\n", "forward + backward, per op", per_op_fwd_bwd,
              kusari::bench::cell(peer_us("forward_backward_us")).c_str(),
              kusari::bench::cell(ratio(per_op_fwd_bwd, peer_us("forward_backward_us"))).c_str());
  return kusari::bench::finish(argc, argv);
}
