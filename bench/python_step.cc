// One training step driven from Python against the same step driven from C++: the MLP
// (784-1000-1000-10) and the small CNN (two 3x3 convolutions with pooling, then a linear layer) at
// batch 100, Adam, through the StandardUpdater (the Trainer's loop) on the same data. The Python
// side (bench/peers/python_step.py) writes the model as a Chain whose forward is Python code and
// times the updater's update() and a loop written in Python; the ratio is Python / C++ (the
// overhead of the Python front end: 1.0 means none). Where PyTorch is installed the peer also
// times the same model and step in PyTorch from Python, and "vs PyTorch" is kusari's Python loop
// over PyTorch's (below 1: kusari faster).
//
//   bench_python_step [--python /usr/bin/python3] [--device cpu|cuda] [--models mlp,cnn] [--cuda-graph]
#include <chrono>
#include <cstdio>
#include <sstream>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;
namespace L = kusari::links;

namespace {

class MLP : public kusari::Chain {
 public:
  MLP() {
    l1 = add_link("l1", std::make_shared<L::Linear>(784, 1000));
    l2 = add_link("l2", std::make_shared<L::Linear>(1000, 1000));
    l3 = add_link("l3", std::make_shared<L::Linear>(1000, 10));
  }
  kusari::Variable forward(const kusari::Variable& x) override {
    return (*l3)(F::relu((*l2)(F::relu((*l1)(x)))));
  }

 private:
  std::shared_ptr<L::Linear> l1, l2, l3;
};

class CNN : public kusari::Chain {
 public:
  CNN() {
    c1 = add_link("c1", std::make_shared<L::Convolution2D>(1, 32, 3, 1, 1));
    c2 = add_link("c2", std::make_shared<L::Convolution2D>(32, 64, 3, 1, 1));
    fc = add_link("fc", std::make_shared<L::Linear>(64 * 7 * 7, 10));
  }
  kusari::Variable forward(const kusari::Variable& x) override {
    kusari::Variable h = F::max_pooling_2d(F::relu((*c1)(x)), 2);
    h = F::max_pooling_2d(F::relu((*c2)(h)), 2);
    return (*fc)(h);
  }

 private:
  std::shared_ptr<L::Convolution2D> c1, c2;
  std::shared_ptr<L::Linear> fc;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A training step driven from Python against the same step from C++"};
  std::string python = "python3", device = "cpu", models = "mlp,cnn";
  int steps = 50, warmup = 5, threads = 0;
  bool cuda_graph = false;
  app.add_option("--python", python, "Interpreter with NumPy and kusari's package (build/python)")->capture_default_str();
  app.add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--models", models, "mlp, cnn or both (comma-separated)")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", warmup, "Untimed steps first")->capture_default_str()->check(CLI::Range(0, 1 << 30));
  app.add_option("--threads", threads, "BLAS threads (0: the library's default)")->capture_default_str();
  app.add_flag("--cuda-graph", cuda_graph, "With --device cuda: replay each step as a CUDA graph (both sides)");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_python_step")) return 0;
  if (cuda_graph && device != "cuda") {
    std::fprintf(stderr, "Error: --cuda-graph needs --device cuda\n");
    return 1;
  }
  kusari::set_num_threads(1);
  if (threads > 0) kusari::set_blas_num_threads(threads);
  const kusari::Device dev = device == "cpu" ? kusari::Device::cpu() : kusari::Device::cuda(0);
  std::printf("a training step (batch 100, Adam) on %s%s, ms per step; ratio = Python / C++; "
              "vs PyTorch = kusari's Python loop / PyTorch's\n", device.c_str(), cuda_graph ? ", CUDA graph replay" : "");
  std::printf("%-6s %12s %16s %16s %10s %10s %12s %11s\n", "model", "C++ updater", "Python updater", "Python loop",
              "ratio upd", "ratio loop", "PyTorch Py", "vs PyTorch");
  std::stringstream list(models);
  for (std::string model; std::getline(list, model, ',');) {
    if (model != "mlp" && model != "cnn") {
      std::fprintf(stderr, "Error: --models: unknown model '%s' (mlp, cnn)\n", model.c_str());
      return 1;
    }
    kusari::manual_seed(0);
    const int64_t batch = 100, n = batch * 10;
    // The Python side's data: numpy.random.RandomState(0).rand(...) is not reproducible here, so both
    // sides time the same shapes, not the same values (the step's cost does not depend on them).
    kusari::Array x = model == "mlp" ? kusari::Array::uniform({n, 784}) : kusari::Array::uniform({n, 1, 28, 28});
    std::vector<int32_t> labels(n);
    for (int64_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(i % 10);
    auto data = std::make_shared<kusari::TupleDataset>(
        std::vector<kusari::Array>{x, kusari::Array::from_vector(labels)});
    std::shared_ptr<kusari::Link> net = model == "mlp" ? std::shared_ptr<kusari::Link>(std::make_shared<MLP>())
                                                       : std::shared_ptr<kusari::Link>(std::make_shared<CNN>());
    auto classifier = std::make_shared<L::Classifier>(net);
    classifier->to_device(dev);
    auto opt = std::make_shared<kusari::optimizers::Adam>();
    opt->setup(classifier);
    auto it = std::make_shared<kusari::SerialIterator>(data, batch, true, false);
    kusari::training::StandardUpdater updater(it, opt, dev);
    updater.set_use_cuda_graph(cuda_graph);
    for (int i = 0; i < warmup; ++i) updater.update();
    dev.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) updater.update();
    dev.synchronize();
    const double cpp_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps * 1e3;
    std::string args = "--model " + model + " --device " + device + " --steps " + std::to_string(steps) +
                       " --warmup " + std::to_string(warmup) + " --threads " + std::to_string(threads);
    if (cuda_graph) args += " --cuda-graph";
    auto py = kusari::bench::try_peer(python, "python_step.py", args);
    std::optional<double> upd, loop, r_upd, r_loop, torch_ms, r_torch;
    if (py) {
      upd = py->at("updater_ms");
      loop = py->at("python_loop_ms");
      r_upd = *upd / cpp_ms;
      r_loop = *loop / cpp_ms;
      if (py->count("torch_ms")) {
        torch_ms = py->at("torch_ms");
        r_torch = *loop / *torch_ms;
      }
    }
    std::printf("%-6s %12.3f %16s %16s %10s %10s %12s %11s\n", model.c_str(), cpp_ms,
                kusari::bench::cell(upd).c_str(), kusari::bench::cell(loop).c_str(),
                kusari::bench::cell(r_upd).c_str(), kusari::bench::cell(r_loop).c_str(),
                kusari::bench::cell(torch_ms).c_str(), kusari::bench::cell(r_torch).c_str());
  }
  return kusari::bench::finish(argc, argv);
}
