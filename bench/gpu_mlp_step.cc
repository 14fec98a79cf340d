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
// With --dtype float16, the mixed-precision step instead: float16 parameters and activations,
// Adam on float32 master weights, dynamic loss scaling (as train_mnist --dtype float16), eagerly;
// once as the built-in Adam runs it (the overflow count is the update kernels' skip flag and is
// read a step later, Note [Dynamic loss scaling]) and once reading the count before the updates,
// against PyTorch's autocast(float16) with GradScaler.
//
//   bench_gpu_mlp_step [--python python3] [--steps 500] [--device 0] [--compile]
//                      [--dtype float32|float16]
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

/// Adam that reads dynamic loss scaling's overflow count before its updates, as optimizers that do
/// not step through update_parameter's skip flag do.
class AdamCheckingFirst : public kusari::optimizers::Adam {
 protected:
  bool skips_on_device() const override { return false; }
};

/// The float16 rows: ms per eager step of `opt` on a fresh float16 model.
double float16_step_ms(const kusari::Device& device, int steps, kusari::Optimizer& opt) {
  kusari::manual_seed(0);
  auto model =
      std::make_shared<kusari::links::Classifier>(std::make_shared<kusari::bench::MnistMLP>());
  model->compute_accuracy = false;
  model->to_device(device);
  model->to_dtype(kusari::float16);
  opt.setup(model);
  opt.use_fp32_update();
  opt.loss_scaling();
  kusari::Array x = kusari::Array::uniform({100, 784}, 0, 1, kusari::float16, device);
  std::vector<int32_t> labels(100);
  for (int i = 0; i < 100; ++i) labels[static_cast<size_t>(i)] = i % 10;
  kusari::Array t = kusari::Array::from_vector(labels, std::nullopt, device);
  const double ms = time_steps(
      device, steps, [&] { opt.update([&]() { return (*model)(kusari::Variable(x), t); }); });
  std::printf("(%s: loss scale %g after %lld steps taken)\n", opt.type_name(), opt.loss_scale(),
              static_cast<long long>(opt.t()));
  return ms;
}

int float16_main(int argc, char** argv, const std::string& python, int steps, int index) {
  const kusari::Device device = kusari::Device::cuda(index);
  kusari::optimizers::Adam later;
  AdamCheckingFirst first;
  // In turns, twice, so that neither row has the GPU's warmer minutes.
  double later_ms = 1e30, first_ms = 1e30;
  for (int round = 0; round < 2; ++round) {
    later_ms = std::min(later_ms, float16_step_ms(device, steps, later));
    first_ms = std::min(first_ms, float16_step_ms(device, steps, first));
  }
  std::printf(
      "MNIST MLP mixed-precision training step (float16, Adam on float32 master weights, dynamic "
      "loss scaling), batch 100, one GPU, ms per step (best of two)\n");
  std::printf("%-52s %10.4f\n", "kusari eager, overflow count read a step later", later_ms);
  std::printf("%-52s %10.4f\n", "kusari eager, overflow count read before updates", first_ms);
  std::printf("ratio read later / read first = %.3f\n", later_ms / first_ms);
  auto peer = kusari::bench::try_peer(python, "gpu_mlp_step.py",
                                      "--steps " + std::to_string(steps) + " --device " +
                                          std::to_string(index) + " --dtype float16");
  if (peer) {
    std::printf("%-52s %10.4f\n", "pytorch eager, autocast float16 + GradScaler",
                peer->at("eager_ms"));
    std::printf("ratio kusari (read later) / pytorch = %.3f\n", later_ms / peer->at("eager_ms"));
  }
  return kusari::bench::finish(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MLP training step on a GPU (eager and as a CUDA graph), kusari beside PyTorch"};
  std::string python = "python3", dtype = "float32";
  int steps = 500, index = 0;
  bool compile = false;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--device", index, "CUDA device")->capture_default_str()->check(CLI::Range(0, 1 << 30));
  app.add_option("--dtype", dtype, "float32, or float16 (mixed precision with loss scaling)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16"}));
  app.add_flag("--compile", compile, "Also time the PyTorch peer under torch.compile");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_gpu_mlp_step")) return 0;
  if (!kusari::cuda_available()) {
    std::fprintf(stderr, "bench_gpu_mlp_step: no CUDA device is available\n");
    return 1;
  }
  if (dtype == "float16") return float16_main(argc, argv, python, steps, index);
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

  std::printf("MNIST MLP training step (forward + backward + Adam), batch 100, one GPU, ms per step\n");
  std::printf("%-44s %10.4f\n", "kusari eager", eager_ms);
  std::printf("%-44s %10.4f  (%lld graph nodes)\n", "kusari CUDA graph (fwd+bwd) + eager Adam", graph_ms,
              static_cast<long long>(graph.num_nodes()));
  auto ran = kusari::bench::try_peer(python, "gpu_mlp_step.py",
                                     "--steps " + std::to_string(steps) + " --device " + std::to_string(index) +
                                         (compile ? " --compile" : ""));
  if (!ran) return kusari::bench::finish(argc, argv);
  const std::map<std::string, double>& peer = *ran;
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
  return kusari::bench::finish(argc, argv);
}
