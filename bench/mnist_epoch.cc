// One training epoch of the MNIST MLP (784-1000-1000-10, ReLU, Adam, batch 100) on the real
// Fashion-MNIST training set through the full training loop (iterator, converter, Classifier,
// optimizer), against the same epoch in PyTorch's CPU build in the same run, over thread settings
// (kernel threads + BLAS threads); each framework's best setting is compared.
//
//   bench_mnist_epoch [--python python3] [--iterations 600] [--configs 1+1,1+2,2+2]
#include <chrono>
#include <cstdio>
#include <sstream>

#include "bench_models.h"
#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;
namespace L = kusari::links;

int main(int argc, char** argv) {
  CLI::App app{"MNIST training epoch on CPUs, kusari beside PyTorch"};
  std::string python = "python3", configs = "1+1,1+2,2+2";
  int iterations = 600;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--iterations", iterations, "Training steps (600 of batch 100: one epoch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--configs", configs, "Thread settings, kernel threads + BLAS threads, comma-separated")
      ->capture_default_str();
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mnist_epoch")) return 0;
  auto [train, test] = kusari::get_fashion_mnist();
  std::printf("MNIST MLP training epoch (600 iterations of batch 100 on Fashion-MNIST), seconds per epoch\n");
  std::printf("%-22s %12s %12s\n", "threads (omp+blas)", "kusari", "pytorch");
  double best_k = 1e30, best_p = 1e30;
  std::string best_k_cfg, best_p_cfg;
  std::stringstream ss(configs);
  std::string cfg;
  while (std::getline(ss, cfg, ',')) {
    const int omp = std::stoi(cfg.substr(0, cfg.find('+')));
    const int blas = std::stoi(cfg.substr(cfg.find('+') + 1));
    kusari::set_num_threads(omp);
    kusari::set_blas_num_threads(blas);
    kusari::manual_seed(0);
    auto model = std::make_shared<L::Classifier>(std::make_shared<kusari::bench::MnistMLP>());
    auto optimizer = std::make_shared<kusari::optimizers::Adam>();
    optimizer->setup(model);
    auto it = std::make_shared<kusari::SerialIterator>(train, 100, true, true, 0);
    kusari::training::StandardUpdater updater(it, optimizer);
    for (int i = 0; i < 5; ++i) updater.update();  // warm-up
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) updater.update();
    const double k = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 600.0 / iterations;
    auto peer = kusari::bench::try_peer(python, "mnist_epoch.py",
                                        "--threads " + std::to_string(omp) + " --iterations " + std::to_string(iterations),
                                        "OPENBLAS_NUM_THREADS=" + std::to_string(blas));
    std::optional<double> p;
    if (peer) p = peer->at("seconds_per_epoch");
    std::printf("%-22s %12.3f %12s\n", cfg.c_str(), k, kusari::bench::cell(p).c_str());
    if (k < best_k) best_k = k, best_k_cfg = cfg;
    if (p && *p < best_p) best_p = *p, best_p_cfg = cfg;
  }
  if (best_p_cfg.empty()) {
    std::printf("best: kusari %.3f s (%s), pytorch - (no peer run finished)\n", best_k, best_k_cfg.c_str());
  } else {
    std::printf("best: kusari %.3f s (%s), pytorch %.3f s (%s), ratio kusari/pytorch = %.3f\n", best_k,
                best_k_cfg.c_str(), best_p, best_p_cfg.c_str(), best_k / best_p);
  }
  return kusari::bench::finish(argc, argv);
}
