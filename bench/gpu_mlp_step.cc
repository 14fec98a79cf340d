// One training step (forward, backward, Adam update) of the MNIST MLP 784-1000-1000-10 at batch
// 100 on one GPU, against PyTorch eager on the same GPU in the same run. Steps are queued
// back to back and the device is synchronised once at the end, as a training loop runs.
//
//   bench_gpu_mlp_step [--python python3] [--steps 500] [--device 0] [--compile]
#include <chrono>
#include <cstdio>

#include "bench_models.h"
#include "bench_util.h"
#include "kusari/kusari.h"

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
  auto step = [&]() { adam.update([&]() { return (*model)(kusari::Variable(x), t); }); };
  for (int i = 0; i < 20; ++i) step();
  device.synchronize();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  device.synchronize();
  const double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps * 1e3;
  bool compile = false;
  for (int i = 1; i < argc; ++i) compile = compile || std::string(argv[i]) == "--compile";
  auto peer = kusari::bench::run_peer(python, "gpu_mlp_step.py",
                                      "--steps " + std::to_string(steps) + " --device " + std::to_string(index) +
                                          (compile ? " --compile" : ""));
  std::printf("MNIST MLP training step (forward + backward + Adam), batch 100, one GPU, ms per step\n");
  std::printf("%-28s %10.4f\n", "kusari", ms);
  std::printf("%-28s %10.4f\n", "pytorch eager", peer.at("eager_ms"));
  if (peer.count("compiled_ms")) std::printf("%-28s %10.4f\n", "pytorch torch.compile", peer.at("compiled_ms"));
  std::printf("ratio kusari / pytorch eager = %.3f\n", ms / peer.at("eager_ms"));
  if (peer.count("compiled_ms")) std::printf("ratio kusari / pytorch compiled = %.3f\n", ms / peer.at("compiled_ms"));
  std::printf("reproduce: %s\n", kusari::bench::command_line(argc, argv).c_str());
  return 0;
}
