// Training-mode batch normalization, forward and backward, over the 53 batch norms of a ResNet-50
// (their channel counts and spatial sizes at the given batch and input size), against PyTorch's
// F.batch_norm on the same device in the same run: with cuDNN's batch norm routines (PyTorch's
// choice for NCHW float32 on GPUs) and with them turned off (PyTorch's own kernels).
//
// Rows per (dtype, layout): kusari's fused batch normalization; kusari's batch norm with the
// relu epilogue (functions::batch_normalization_relu) against PyTorch's batch norm then relu.
// 16-bit rows keep the parameters and statistics in float32, as mixed-precision training does.
//
//   bench_batch_norm [--device cuda|cpu] [--batch 128] [--size 224] [--repeats 20]
//                    [--dtypes float32,bfloat16] [--layouts nchw,cl] [--python python3] [--no-peer]
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace {

namespace F = kusari::functions;

struct Layer {
  int64_t channels, hw;
};

// The batch norms of torchvision's ResNet-50 (v1.5: the stride on the 3x3 convolution), as
// (channels, spatial size) for an input of `size`.
std::vector<Layer> resnet50_batch_norms(int64_t size) {
  std::vector<Layer> l;
  int64_t hw = size / 2;
  l.push_back({64, hw});  // stem
  hw /= 2;                // max pooling
  const int blocks[4] = {3, 4, 6, 3};
  int64_t width = 64;
  for (int stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < blocks[stage]; ++b) {
      const bool first = b == 0;
      const int64_t in_hw = hw;
      const int64_t out_hw = (first && stage > 0) ? hw / 2 : hw;
      l.push_back({width, in_hw});       // 1x1 reduce
      l.push_back({width, out_hw});      // 3x3 (strided in the first block of stages 2-4)
      l.push_back({width * 4, out_hw});  // 1x1 expand
      if (first) l.push_back({width * 4, out_hw});  // the shortcut's projection
      hw = out_hw;
    }
    width *= 2;
  }
  return l;
}

struct Inputs {
  kusari::Array x, residual, gy;
};

double time_ms(const kusari::Device& device, int repeats, const std::function<void()>& pass) {
  for (int i = 0; i < 3; ++i) pass();
  device.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) pass();
  device.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         repeats;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ResNet-50's batch norms, forward and backward: kusari beside PyTorch"};
  std::string device_name = "cuda", python = "python3", dtypes = "float32,bfloat16",
              layouts = "nchw,cl";
  int64_t batch = 128, size = 224;
  int repeats = 20;
  bool no_peer = false;
  app.add_option("--device", device_name, "cuda or cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--batch", batch, "Batch size")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--size", size, "Input image size (the batch norms' spatial sizes follow)")
      ->capture_default_str()
      ->check(CLI::Range(32, 1024));
  app.add_option("--repeats", repeats, "Timed passes")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--dtypes", dtypes, "Comma list of float32, bfloat16, float16")
      ->capture_default_str();
  app.add_option("--layouts", layouts, "Comma list of nchw, cl (channels-last)")
      ->capture_default_str();
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")
      ->capture_default_str();
  app.add_flag("--no-peer", no_peer, "Do not run PyTorch");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_batch_norm")) return 0;

  const kusari::Device device =
      device_name == "cuda" ? kusari::Device::cuda(0) : kusari::Device::cpu();
  if (device.is_cuda() && !kusari::cuda_available()) {
    std::fprintf(stderr, "bench_batch_norm: no CUDA device is available\n");
    return 1;
  }
  const std::vector<Layer> layers = resnet50_batch_norms(size);
  std::printf(
      "ResNet-50's %zu batch norms at batch %lld, input %lld, on %s: ms per forward + "
      "backward of all of them (parameters and statistics in float32)\n",
      layers.size(), static_cast<long long>(batch), static_cast<long long>(size),
      device_name.c_str());
  std::printf("%-10s %-6s %-22s %10s %10s %10s %8s\n", "dtype", "layout", "op", "kusari", "torch",
              "torch-nocudnn", "ratio");

  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
    return out;
  };
  for (const std::string& dname : split(dtypes)) {
    const kusari::Dtype dtype = kusari::dtype_from_name(dname);
    for (const std::string& layout : split(layouts)) {
      const bool cl = layout == "cl";
      // One set of arrays per distinct shape, shared by the layers of that shape.
      std::map<std::pair<int64_t, int64_t>, Inputs> inputs;
      for (const Layer& l : layers) {
        auto key = std::make_pair(l.channels, l.hw);
        if (inputs.count(key)) continue;
        const kusari::Shape shape{batch, l.channels, l.hw, l.hw};
        const auto fmt =
            cl ? kusari::MemoryFormat::kChannelsLast : kusari::MemoryFormat::kContiguous;
        Inputs in;
        in.x = kusari::Array::uniform(shape, -2, 3, dtype, device).to_memory_format(fmt);
        in.residual = kusari::Array::uniform(shape, -1, 1, dtype, device).to_memory_format(fmt);
        in.gy = kusari::Array::uniform(shape, -1, 1, dtype, device).to_memory_format(fmt);
        inputs[key] = in;
      }
      std::vector<kusari::Parameter> gammas, betas;
      std::vector<kusari::Array> means, vars;
      for (const Layer& l : layers) {
        gammas.emplace_back(kusari::Array::ones({l.channels}, kusari::float32, device));
        betas.emplace_back(kusari::Array::zeros({l.channels}, kusari::float32, device));
        means.push_back(kusari::Array::zeros({l.channels}, kusari::float32, device));
        vars.push_back(kusari::Array::ones({l.channels}, kusari::float32, device));
      }
      auto pass = [&](bool relu) {
        for (size_t i = 0; i < layers.size(); ++i) {
          const Inputs& in = inputs.at({layers[i].channels, layers[i].hw});
          kusari::Variable x(in.x, true);
          gammas[i].cleargrad();
          betas[i].cleargrad();
          kusari::Variable y =
              relu ? F::batch_normalization_relu(x, gammas[i], betas[i],
                                                 kusari::Variable(in.residual), 1e-5, &means[i],
                                                 &vars[i], 0.9)
                   : F::batch_normalization(x, gammas[i], betas[i], 1e-5, &means[i], &vars[i], 0.9);
          y.set_grad(in.gy);
          y.backward();
        }
      };
      const double bn_ms = time_ms(device, repeats, [&] { pass(false); });
      const double relu_ms = time_ms(device, repeats, [&] { pass(true); });
      std::map<std::string, double> peer;
      if (!no_peer) {
        std::ostringstream args;
        args << "--device " << device_name << " --batch " << batch << " --size " << size
             << " --repeats " << repeats << " --dtype " << dname << " --layout " << layout;
        if (auto ran = kusari::bench::try_peer(python, "batch_norm.py", args.str())) peer = *ran;
      }
      auto row = [&](const char* op, double ours, const char* key) {
        const double torch = peer.count(std::string(key)) ? peer.at(key) : 0.0;
        const double nocudnn = peer.count(std::string(key) + "_nocudnn")
                                   ? peer.at(std::string(key) + "_nocudnn")
                                   : 0.0;
        double best = torch;
        if (nocudnn > 0 && (best == 0 || nocudnn < best)) best = nocudnn;
        auto figure = [](double v) -> std::optional<double> {
          if (v > 0) return v;
          return std::nullopt;
        };
        std::printf("%-10s %-6s %-22s %10.3f %10s %10s %8s\n", dname.c_str(), layout.c_str(), op,
                    ours, kusari::bench::cell(figure(torch)).c_str(),
                    kusari::bench::cell(figure(nocudnn)).c_str(),
                    kusari::bench::cell(figure(best > 0 ? ours / best : 0.0), 2).c_str());
      };
      row("bn", bn_ms, "bn_ms");
      row("bn + add + relu", relu_ms, "bn_add_relu_ms");
    }
  }
  std::printf("ratio: kusari ms / the faster PyTorch ms (below 1: kusari is faster)\n");
  return kusari::bench::finish(argc, argv);
}
