// Convolution-bound step: the small Fashion-MNIST CNN (conv 3x3 1->32, batch norm, ReLU, 2x2 max
// pooling; conv 3x3 32->64, batch norm, ReLU, 2x2 max pooling; Linear 3136->10) trained one
// MomentumSGD step at batch 100 on 28x28 images, in NCHW and in channels-last, against PyTorch's
// CPU build in the same run with the same number of threads. Each kusari row also splits its step
// into forward, backward and update.
//
//   bench_cnn_step [--python python3] [--repeats 20] [--threads 1]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/links/batch_normalization.h"
#include "kusari/links/convolution_2d.h"

namespace F = kusari::functions;
namespace L = kusari::links;
using kusari::Array;
using kusari::MemoryFormat;
using kusari::Variable;

namespace {

class SmallCnn : public kusari::Chain {
 public:
  SmallCnn() {
    conv1 = add_link("conv1", std::make_shared<L::Convolution2D>(1, 32, 3, 1, 1));
    bn1 = add_link("bn1", std::make_shared<L::BatchNormalization>(32));
    conv2 = add_link("conv2", std::make_shared<L::Convolution2D>(32, 64, 3, 1, 1));
    bn2 = add_link("bn2", std::make_shared<L::BatchNormalization>(64));
    fc = add_link("fc", std::make_shared<L::Linear>(64 * 7 * 7, 10));
  }
  Variable forward(const Variable& x) override {
    Variable h = F::max_pooling_2d(F::relu((*bn1)((*conv1)(x))), 2, 2, 0, false);
    h = F::max_pooling_2d(F::relu((*bn2)((*conv2)(h))), 2, 2, 0, false);
    return (*fc)(F::reshape(h, {h.shape()[0], 64 * 7 * 7}));
  }
  std::shared_ptr<L::Convolution2D> conv1, conv2;
  std::shared_ptr<L::BatchNormalization> bn1, bn2;
  std::shared_ptr<L::Linear> fc;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Small CNN training step on CPUs, kusari beside PyTorch"};
  std::string python = "python3";
  int repeats = 20, threads = 1;
  app.add_option("--python", python, "Interpreter that runs the PyTorch peer")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed steps per layout (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--threads", threads,
                 "Threads of both frameworks (kusari's kernels and BLAS; torch.set_num_threads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_cnn_step")) return 0;
  kusari::set_num_threads(threads);
  kusari::set_blas_num_threads(threads);
  const int64_t batch = 100;
  constexpr int kWarmup = 3;  // untimed steps first (primitive creation, memory pools)

  std::printf(
      "CNN conv32-bn-relu-pool, conv64-bn-relu-pool, linear; batch 100, 28x28, MomentumSGD step, "
      "%d thread%s\n",
      threads, threads == 1 ? "" : "s");
  std::printf("(ms per step, median of %d; kusari's step split as forward + backward + update)\n",
              repeats);
  std::printf("%-14s %10s %10s %8s   %s\n", "layout", "kusari", "pytorch", "ratio",
              "kusari fwd / bwd / update");
  for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    kusari::manual_seed(0);
    auto model = std::make_shared<SmallCnn>();
    kusari::optimizers::MomentumSGD opt(0.01, 0.9);
    opt.setup(model);
    model->to_memory_format(format);
    Array x = Array::uniform({batch, 1, 28, 28});
    std::vector<int32_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(i % 10);
    const Array t = Array::from_vector(labels);
    x = x.to_memory_format(format);
    double fwd = 0, bwd = 0, upd = 0;
    int calls = 0, timed = 0;
    auto step = [&]() {
      const double a = now();
      model->cleargrads();
      Variable loss = F::softmax_cross_entropy((*model)(Variable(x)), t);
      const double b = now();
      loss.backward();
      const double c = now();
      opt.update();
      const double d = now();
      if (++calls > kWarmup) fwd += b - a, bwd += c - b, upd += d - c, ++timed;
    };
    const double k = kusari::bench::median_seconds(step, repeats, kWarmup) * 1e3;
    const double scale = 1e3 / timed;
    const std::string flag = format == MemoryFormat::kChannelsLast ? " --channels-last" : "";
    auto peer = kusari::bench::try_peer(
        python, "cnn_step.py",
        "--threads " + std::to_string(threads) + " --repeats " + std::to_string(repeats) + flag);
    std::optional<double> p, ratio;
    if (peer) p = peer->at("ms_per_step"), ratio = k / *p;
    std::printf("%-14s %10.3f %10s %8s   %.2f / %.2f / %.2f\n",
                kusari::memory_format_name(format), k, kusari::bench::cell(p).c_str(),
                kusari::bench::cell(ratio).c_str(), fwd * scale, bwd * scale, upd * scale);
  }
  std::printf("ratio = kusari / pytorch (below 1: kusari is faster)\n");
  return kusari::bench::finish(argc, argv);
}
