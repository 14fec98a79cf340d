// One training step (forward, backward, Adam update) of the MNIST MLP 784-1000-1000-10 at batch
// 100 on one GPU, against PyTorch on the same GPU in the same run. Steps are queued back to back
// and the device is synchronised once at the end, as a training loop runs.
//
// Rows: kusari eager; kusari with forward and backward captured in a CUDA graph (cuda::Graph)
// and the Adam update run eagerly after each replay; PyTorch eager; PyTorch with forward and
// backward captured by torch.cuda.graph the same way (the like-for-like peer of our graph row);
// with --compile also torch.compile (default mode, and "reduce-overhead", which uses CUDA
// graphs itself).
//
//   bench_gpu_mlp_step [--python python3] [--steps 500] [--device 0] [--compile]
#include <chrono>
#include <cstdio>
#include <functional>

#include "bench_models.h"
#include "bench_util.h"
#include "kusari/core/cuda.h"
#include "kusari/kusari.h"

namespace {

/// Milliseconds per call of `step`, after 20 warm-up calls, with one synchronisation at the end.
double time_steps(const kusari::Device& device, int steps, const std::function<void()>& step) {
  for (int i = 0; i < 20; ++i) step();
  device.synchronize();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  device.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string python = kusari::bench::flag(argc, argv, "python", "python3");
  const int steps = std::stoi(kusari::bench::flag(argc, argv, "steps", "500"));
  const int index = std::stoi(kusari::bench::flag(argc, argv, "device", "0"));
  if (!kusari::cuda_available()) {
    std::fprintf(stderr, "bench_gpu_mlp_step: no CUDA device is available\n");
    return 1;
  }
  const kusari::Device device = kusari::Device::cuda(index);
  kusari::manual_seed(0);
  auto model = std::make_shared<kusari::links::Classifier>(std::make_shared<kusari::bench::MnistMLP>());
  model->compute_accuracy = false;
  model->to_device(device);
  kusari::optimizers::Adam adam;
  adam.setup(model);
  kusari::Array x = kusari::Array::uniform({100, 784}, 0, 1, kusari::float32, device);
  std::vector<int32_t> labels(100);
  for (int i = 0; i < 100; ++i) labels[static_cast<size_t>(i)] = i % 10;
  kusari::Array t = kusari::Array::from_vector(labels, std::nullopt, device);

  const double eager_ms =
      time_steps(device, steps, [&] { adam.update([&]() { return (*model)(kusari::Variable(x), t); }); });

  // Forward and backward recorded once; each step replays them and runs Adam's fused updates
  // eagerly (their bias correction changes every step). x and t are the graph's inputs: a
  // training loop assign()s each batch into them before the replay.
  kusari::Variable loss;
  kusari::cuda::Graph graph;
  graph.capture(device, [&] {
    model->cleargrads();
    loss = (*model)(kusari::Variable(x), t);
    loss.backward();
  });
  const double graph_ms = time_steps(device, steps, [&] {
    graph.replay();
    adam.update();
  });

  bool compile = false;
  for (int i = 1; i < argc; ++i) compile = compile || std::string(argv[i]) == "--compile";
  auto peer = kusari::bench::run_peer(python, "gpu_mlp_step.py",
                                      "--steps " + std::to_string(steps) + " --device " + std::to_string(index) +
                                          (compile ? " --compile" : ""));
  std::printf("MNIST MLP training step (forward + backward + Adam), batch 100, one GPU, ms per step\n");
  std::printf("%-44s %10.4f\n", "kusari eager", eager_ms);
  std::printf("%-44s %10.4f  (%lld graph nodes)\n", "kusari CUDA graph (fwd+bwd) + eager Adam", graph_ms,
              static_cast<long long>(graph.num_nodes()));
  std::printf("%-44s %10.4f\n", "pytorch eager", peer.at("eager_ms"));
  if (peer.count("graph_ms")) std::printf("%-44s %10.4f\n", "pytorch CUDA graph (fwd+bwd) + eager Adam", peer.at("graph_ms"));
  if (peer.count("compiled_ms")) std::printf("%-44s %10.4f\n", "pytorch torch.compile", peer.at("compiled_ms"));
  if (peer.count("compiled_ro_ms"))
    std::printf("%-44s %10.4f\n", "pytorch torch.compile reduce-overhead", peer.at("compiled_ro_ms"));
  std::printf("ratio kusari eager / pytorch eager = %.3f\n", eager_ms / peer.at("eager_ms"));
  std::printf("ratio kusari graph / pytorch eager = %.3f\n", graph_ms / peer.at("eager_ms"));
  if (peer.count("graph_ms")) std::printf("ratio kusari graph / pytorch graph = %.3f\n", graph_ms / peer.at("graph_ms"));
  for (const char* key : {"compiled_ms", "compiled_ro_ms"}) {
    if (peer.count(key)) {
      std::printf("ratio kusari graph / pytorch %s = %.3f\n",
                  std::string(key) == "compiled_ms" ? "compiled" : "compiled reduce-overhead",
                  graph_ms / peer.at(key));
    }
  }
  std::printf("reproduce: %s\n", kusari::bench::command_line(argc, argv).c_str());
  return 0;
}
