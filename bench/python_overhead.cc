// The overhead of one operation called from Python: kusari's Python package beside PyTorch's,
// both from the same interpreter, on the chain of small ops of bench_op_overhead (y = y * w + x,
// 8 elements), with autograd on (forward; forward + backward) and off. kusari's own C++ figure is
// the floor both aim at. Microseconds per op; the ratio is kusari / PyTorch (below 1: kusari
// cheaper).
//
//   bench_python_overhead [--python /usr/bin/python3] [--device cpu|cuda] [--chains 2000]
#include <cstdio>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;

int main(int argc, char** argv) {
  CLI::App app{"Per-op overhead from Python: kusari beside PyTorch"};
  std::string python = "python3", device = "cpu";
  int chains = 2000;
  app.add_option("--python", python,
                 "Interpreter with NumPy, kusari's package (build/python) and PyTorch")->capture_default_str();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--chains", chains, "Chains of 100 ops per timing")->capture_default_str()->check(CLI::Range(10, 1 << 30));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_python_overhead")) return 0;

  // kusari from C++: the floor.
  constexpr int kLength = 100;
  kusari::set_num_threads(1);
  const kusari::Device dev = device == "cpu" ? kusari::Device::cpu() : kusari::Device::cuda(0);
  kusari::Variable x(kusari::Array::uniform({8}).to_device(dev), true);
  kusari::Variable w(kusari::Array::uniform({8}).to_device(dev), true);
  auto run_chain = [&]() {
    kusari::Variable y = x;
    for (int i = 0; i < kLength / 2; ++i) y = y * w + x;
    return y;
  };
  const int n = chains / 10;
  const double cpp_fwd = kusari::bench::median_seconds([&] {
    for (int c = 0; c < n; ++c) run_chain();
    dev.synchronize();
  }, 10) / (n * kLength) * 1e6;
  double cpp_nograd = 0;
  {
    kusari::NoBackpropMode no_backprop;
    cpp_nograd = kusari::bench::median_seconds([&] {
      for (int c = 0; c < n; ++c) run_chain();
      dev.synchronize();
    }, 10) / (n * kLength) * 1e6;
  }
  const double cpp_fwd_bwd = kusari::bench::median_seconds([&] {
    for (int c = 0; c < n; ++c) F::sum(run_chain()).backward();
    dev.synchronize();
  }, 10) / (n * kLength) * 1e6;

  const std::string args = "--device " + device + " --chains " + std::to_string(chains);
  auto ours = kusari::bench::try_peer(python, "python_ops.py", "--framework kusari " + args);
  auto torch = kusari::bench::try_peer(python, "python_ops.py", "--framework torch " + args);
  auto get = [](const std::optional<std::map<std::string, double>>& r, const char* key) -> std::optional<double> {
    if (r && r->count(key)) return r->at(key);
    return std::nullopt;
  };
  std::printf("per-op overhead from Python, 8-element float32 ops on %s, microseconds per op\n", device.c_str());
  std::printf("%-28s %12s %12s %12s %10s\n", "", "kusari C++", "kusari Py", "PyTorch Py", "Py ratio");
  for (auto [label, key, cpp] : {std::tuple{"autograd on, forward", "forward_us", cpp_fwd},
                                 std::tuple{"autograd off, forward", "forward_nograd_us", cpp_nograd},
                                 std::tuple{"forward + backward", "forward_backward_us", cpp_fwd_bwd}}) {
    std::optional<double> k = get(ours, key), t = get(torch, key), r;
    if (k && t) r = *k / *t;
    std::printf("%-28s %12.3f %12s %12s %10s\n", label, cpp, kusari::bench::cell(k).c_str(),
                kusari::bench::cell(t).c_str(), kusari::bench::cell(r).c_str());
  }
  return kusari::bench::finish(argc, argv);
}
