// One optimizer update step over ResNet-50's parameters (161 tensors, 25,557,032 elements:
// conv weights, batch-norm gammas and betas, the classifier), MomentumSGD and Adam, with the
// multi-tensor update (the default: the parameters stepped in groups, Note [Grouped optimizer
// updates]) and one parameter at a time, against torch.optim in the same run with
// foreach=False and foreach=True (and fused=True on a GPU where the installed PyTorch has it).
// Gradients are set once; each timed call is one update(), the median of --repeats calls (on a
// GPU each call is synchronised).
//
//   bench_optimizer_update [--python python3] [--repeats 10] [--gpu -1]
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace {

/// The parameter shapes of torchvision's ResNet-50 (bottleneck blocks 3, 4, 6, 3; convolutions
/// without bias, each followed by batch norm's gamma and beta; a 1000-way classifier).
std::vector<kusari::Shape> resnet50_shapes() {
  std::vector<kusari::Shape> shapes;
  auto conv_bn = [&](int64_t out, int64_t in, int64_t k) {
    shapes.push_back({out, in, k, k});
    shapes.push_back({out});
    shapes.push_back({out});
  };
  conv_bn(64, 3, 7);
  int64_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t width = int64_t{64} << stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      conv_bn(width, in, 1);
      conv_bn(width, width, 3);
      conv_bn(width * 4, width, 1);
      if (b == 0) conv_bn(width * 4, in, 1);  // the projection shortcut
      in = width * 4;
    }
  }
  shapes.push_back({1000, 2048});
  shapes.push_back({1000});
  return shapes;
}

/// A link holding one float32 parameter (with a gradient) per shape.
class ShapesLink : public kusari::Link {
 public:
  ShapesLink(const std::vector<kusari::Shape>& shapes, kusari::Device device) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      kusari::Parameter p(kusari::Array::normal(shapes[i], 0.0, 0.01, kusari::float32, device));
      p.set_grad(kusari::Array::normal(shapes[i], 0.0, 0.01, kusari::float32, device));
      add_param("p" + std::to_string(1000 + i), p);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One optimizer update over ResNet-50's parameters, kusari beside torch.optim"};
  std::string python = "python3";
  int repeats = 10, gpu = -1;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed updates per row (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--gpu", gpu, "CUDA device (-1: the CPU)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 20));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_optimizer_update")) return 0;
  if (gpu >= 0 && !kusari::cuda_available()) {
    std::fprintf(stderr,
                 "bench_optimizer_update: --gpu %d was asked for but no CUDA device is available\n",
                 gpu);
    return 1;
  }
  const kusari::Device device = gpu >= 0 ? kusari::Device::cuda(gpu) : kusari::Device::cpu();
  const std::vector<kusari::Shape> shapes = resnet50_shapes();
  int64_t elements = 0;
  for (const kusari::Shape& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    elements += n;
  }
  kusari::manual_seed(0);
  auto link = std::make_shared<ShapesLink>(shapes, device);

  struct Row {
    std::string name;
    double multi_ms, single_ms;
    int64_t multi_calls, single_calls;
  };
  std::vector<Row> rows;
  auto time_update = [&](kusari::Optimizer& opt, bool multi, int64_t* calls) {
    opt.setup(link);
    opt.use_multi_tensor_update(multi);
    const double s = kusari::bench::median_seconds(
        [&] {
          opt.update();
          device.synchronize();
        },
        repeats, 2);
    *calls = opt.last_update_calls();
    return s * 1e3;
  };
  {
    Row r{"MomentumSGD", 0, 0, 0, 0};
    kusari::optimizers::MomentumSGD a(0.01, 0.9), b(0.01, 0.9);
    r.multi_ms = time_update(a, true, &r.multi_calls);
    r.single_ms = time_update(b, false, &r.single_calls);
    rows.push_back(r);
  }
  {
    Row r{"Adam", 0, 0, 0, 0};
    kusari::optimizers::Adam a, b;
    r.multi_ms = time_update(a, true, &r.multi_calls);
    r.single_ms = time_update(b, false, &r.single_calls);
    rows.push_back(r);
  }

  const std::map<std::string, double> peer =
      kusari::bench::try_peer(python, "optimizer_update.py",
                              "--repeats " + std::to_string(repeats) + " --gpu " + std::to_string(gpu))
          .value_or(std::map<std::string, double>{});
  auto peer_ms = [&peer](const std::string& key) -> std::optional<double> {
    if (peer.count(key)) return peer.at(key);
    return std::nullopt;
  };
  std::printf(
      "One optimizer update over ResNet-50's parameters (%zu tensors, %lld float32 elements) on "
      "%s, "
      "ms per update (median of %d)\n",
      shapes.size(), static_cast<long long>(elements), gpu >= 0 ? "one GPU" : "the CPU", repeats);
  std::printf("%-12s %14s %14s %14s %14s %14s %10s %10s\n", "optimizer", "kusari multi",
              "kusari single", "torch foreach", "torch loop", "torch fused", "single/", "multi/");
  std::printf("%-12s %14s %14s %14s %14s %14s %10s %10s\n", "", "", "", "", "", "", "multi",
              "foreach");
  for (const Row& r : rows) {
    const std::string key = r.name == "Adam" ? "adam" : "momentum_sgd";
    const std::optional<double> foreach_ms = peer_ms(key + "_foreach_ms");
    std::optional<double> multi_vs_foreach;
    if (foreach_ms) multi_vs_foreach = r.multi_ms / *foreach_ms;
    std::printf("%-12s %14.3f %14.3f %14s %14s %14s %10.3f %10s\n", r.name.c_str(), r.multi_ms,
                r.single_ms, kusari::bench::cell(foreach_ms).c_str(),
                kusari::bench::cell(peer_ms(key + "_loop_ms")).c_str(),
                kusari::bench::cell(peer_ms(key + "_fused_ms")).c_str(), r.single_ms / r.multi_ms,
                kusari::bench::cell(multi_vs_foreach).c_str());
  }
  for (const Row& r : rows) {
    std::printf(
        "(%s: %lld update routine calls per step multi-tensor, %lld one parameter at a time)\n",
        r.name.c_str(), static_cast<long long>(r.multi_calls),
        static_cast<long long>(r.single_calls));
  }
  return kusari::bench::finish(argc, argv);
}
