// GEMM-bound step: an MLP 784-1000-1000-10 (ReLU) forward + backward with softmax cross entropy
// at batch 100, against PyTorch's CPU build in the same run, over thread settings
// (kernel threads + BLAS threads); the figure to compare is each framework's best setting.
//
//   bench_mlp_step [--python python3] [--repeats 30] [--configs 1+1,1+2,2+2]
#include <cstdio>
#include <sstream>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;
using kusari::Array;
using kusari::Variable;

int main(int argc, char** argv) {
  CLI::App app{"MLP step (forward + backward) on CPUs, kusari beside PyTorch"};
  std::string python = "python3", configs = "1+1,1+2,2+2";
  int repeats = 30;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--repeats", repeats, "Timed steps per setting (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--configs", configs, "Thread settings, kernel threads + BLAS threads, comma-separated")
      ->capture_default_str();
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mlp_step")) return 0;
  const int64_t batch = 100;
  kusari::manual_seed(0);
  Array x = Array::uniform({batch, 784});
  std::vector<int32_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % 10);
  Array t = Array::from_vector(labels);
  kusari::Parameter W1(Array::normal({1000, 784}, 0, 0.035)), b1(Array::zeros({1000}));
  kusari::Parameter W2(Array::normal({1000, 1000}, 0, 0.03)), b2(Array::zeros({1000}));
  kusari::Parameter W3(Array::normal({10, 1000}, 0, 0.03)), b3(Array::zeros({10}));
  auto step = [&]() {
    for (auto* p : {&W1, &b1, &W2, &b2, &W3, &b3}) p->cleargrad();
    Variable h = F::relu(F::linear(x, W1, b1));
    h = F::relu(F::linear(h, W2, b2));
    Variable loss = F::softmax_cross_entropy(F::linear(h, W3, b3), t);
    loss.backward();
  };

  std::printf("MLP 784-1000-1000-10, batch 100, forward + backward (ms per step, median of %d)\n", repeats);
  std::printf("%-22s %12s %12s\n", "threads (omp+blas)", "kusari", "pytorch");
  double best_k = 1e9, best_p = 1e9;
  std::string best_k_cfg, best_p_cfg;
  std::stringstream ss(configs);
  std::string cfg;
  while (std::getline(ss, cfg, ',')) {
    const int omp = std::stoi(cfg.substr(0, cfg.find('+')));
    const int blas = std::stoi(cfg.substr(cfg.find('+') + 1));
    kusari::set_num_threads(omp);
    kusari::set_blas_num_threads(blas);
    double k = kusari::bench::median_seconds(step, repeats) * 1e3;
    auto peer = kusari::bench::try_peer(python, "mlp_step.py",
                                        "--threads " + std::to_string(omp) + " --repeats " + std::to_string(repeats),
                                        "OPENBLAS_NUM_THREADS=" + std::to_string(blas));
    std::optional<double> p;
    if (peer) p = peer->at("ms_per_step");
    std::printf("%-22s %12.3f %12s\n", cfg.c_str(), k, kusari::bench::cell(p).c_str());
    if (k < best_k) best_k = k, best_k_cfg = cfg;
    if (p && *p < best_p) best_p = *p, best_p_cfg = cfg;
  }
  if (best_p_cfg.empty()) {
    std::printf("best: kusari %.3f ms (%s), pytorch - (no peer run finished)\n", best_k, best_k_cfg.c_str());
  } else {
    std::printf("best: kusari %.3f ms (%s), pytorch %.3f ms (%s), ratio kusari/pytorch = %.3f\n", best_k,
                best_k_cfg.c_str(), best_p, best_p_cfg.c_str(), best_k / best_p);
  }
  return kusari::bench::finish(argc, argv);
}
