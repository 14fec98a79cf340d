// ResNet training steps (forward, backward, MomentumSGD 0.9) on random images, kusari beside
// PyTorch (torchvision's model, SGD with momentum 0.9) in the same run, for each of the rows
//   f32-nchw   float32, NCHW
//   f32-cl     float32, channels-last (model->to_memory_format and channels-last inputs)
//   bf16-nchw  mixed precision: kusari's bfloat16 model (batch norm in float32) with float32
//              master weights (use_fp32_update), against torch.autocast(bfloat16)
//   bf16-cl    the same in channels-last
// Per row: kusari eager; on a GPU kusari with the whole step (forward, backward and the update)
// replayed from a CUDA graph; PyTorch eager (cudnn.benchmark on); with --compile torch.compile.
// Every row runs in a process of its own (this program started again with --child, or the peer
// script), so each peak memory is that row's: the peak of the bytes kusari's arrays asked the
// CUDA memory pool for (cuda::memory_stats().peak_requested_bytes; the pool's blocks round them
// up) against torch.cuda.max_memory_allocated, or the peak resident set of
// the process on a CPU. On a GPU both sides start their peaks over after the warm-up steps (the
// graph row's peak also spans its capture). Ratios are of throughput (images per second): above
// 1, kusari is faster.
//
//   bench_resnet50 [--arch resnet50] [--device cuda|cpu] [--batch 64] [--size 224] [--steps 20]
//                  [--warmup 5] [--rows f32-nchw,f32-cl,bf16-nchw,bf16-cl] [--tf32 default|on|off]
//                  [--compile] [--python python3] [--no-peer]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kusari/core/cuda.h"
#include "kusari/kusari.h"
#include "kusari/models.h"

namespace {

namespace F = kusari::functions;

struct Config {
  std::string arch = "resnet50", device = "cuda", rows, tf32 = "default", python = "python3";
  int batch = 64, size = 224, steps = 20, warmup = 5;
  bool compile = false, no_peer = false;
  /// A child with --profile runs its warm-up steps, then one step between profiler_start and
  /// profiler_stop (for `ncu --profile-from-start off`, see scripts/gpu_profile.sh), and ends.
  bool profile = false;
  /// After the timed steps, one more step in its phases (forward, backward, update), with the
  /// peak memory of each printed (GPU only), beside the peer's.
  bool memory_phases = false;
};

int depth_of(const std::string& arch) {
  return std::stoi(arch.substr(std::string("resnet").size()));
}

/// Milliseconds per step after `warmup` untimed steps. With `reset_peak` the GPU's peak memory
/// starts over after the warm-up, as the peer's torch.cuda.reset_peak_memory_stats() does: the
/// first steps choose cuDNN's algorithms by timing them, which is not what a step needs.
double time_steps(const kusari::Device& device, int warmup, int steps,
                  const std::function<void()>& step, bool reset_peak = false) {
  for (int i = 0; i < warmup; ++i) step();
  device.synchronize();
  if (reset_peak && device.is_cuda()) kusari::cuda::reset_peak_memory_stats(device.index());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  device.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps *
         1e3;
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // kilobytes on Linux
}

/// One row of kusari in this process; prints RESULT lines (eager_ms, peak_bytes, and on a GPU
/// graph_ms and graph_peak_bytes).
int run_child(const Config& c, const std::string& row) {
  // cuDNN's algorithms by timing, as the peer's cudnn.benchmark = True (an explicit setting in
  // the environment is kept).
  if (c.device == "cuda") ::setenv("KUSARI_CUDNN_BENCHMARK", "1", 0);
  const bool cuda = c.device == "cuda";
  const kusari::Device device = cuda ? kusari::Device::cuda(0) : kusari::Device::cpu();
  // "default": the libraries' defaults, the same on both sides (TF32 convolutions, float32
  // matrix products).
  if (cuda && c.tf32 != "default") kusari::cuda::set_allow_tf32(c.tf32 == "on");
  const kusari::Dtype dtype = row.rfind("bf16", 0) == 0 ? kusari::bfloat16 : kusari::float32;
  const kusari::MemoryFormat format = row.size() > 3 && row.substr(row.size() - 3) == "-cl"
                                          ? kusari::MemoryFormat::kChannelsLast
                                          : kusari::MemoryFormat::kContiguous;
  kusari::manual_seed(0);
  kusari::models::ResNetOptions options;
  options.dtype = dtype;
  options.memory_format = format;
  auto model = kusari::models::resnet(depth_of(c.arch), options);
  model->to_device(device);
  kusari::optimizers::MomentumSGD opt(0.1, 0.9);
  opt.setup(model);
  if (dtype != kusari::float32) opt.use_fp32_update();
  kusari::Array x =
      kusari::Array::uniform({c.batch, 3, c.size, c.size}, 0, 1, kusari::float32, device)
          .astype(dtype)
          .to_memory_format(format);
  std::vector<int32_t> labels(static_cast<size_t>(c.batch));
  for (int i = 0; i < c.batch; ++i) labels[static_cast<size_t>(i)] = (i * 37) % 1000;
  kusari::Array t = kusari::Array::from_vector(labels, std::nullopt, device);
  auto step = [&] {
    model->cleargrads();
    kusari::Variable loss = F::softmax_cross_entropy((*model)(kusari::Variable(x)), t);
    kusari::BackwardOptions options;
    options.retain_graph = false;  // frees each activation once backward is past it
    loss.backward(options);
    loss = kusari::Variable();
    opt.update();
  };
  if (c.profile) {
    for (int i = 0; i < c.warmup; ++i) step();
    device.synchronize();
    kusari::cuda::profiler_start();
    step();
    device.synchronize();
    kusari::cuda::profiler_stop();
    return 0;
  }
  const double eager_ms = time_steps(device, c.warmup, c.steps, step, /*reset_peak=*/true);
  std::printf("RESULT params %lld\n", static_cast<long long>(model->count_params()));
  std::printf("RESULT eager_ms %.6f\n", eager_ms);
  std::printf("RESULT peak_bytes %.0f\n",
              cuda ? static_cast<double>(kusari::cuda::memory_stats(0).peak_requested_bytes)
                   : peak_rss_bytes());
  if (cuda && c.memory_phases) {
    // The step of `step` above, phase by phase: each phase's peak, and what is live after it.
    const auto phase = [&](const char* name, const std::function<void()>& run) {
      device.synchronize();
      kusari::cuda::reset_peak_memory_stats(0);
      run();
      device.synchronize();
      const kusari::cuda::MemoryStats s = kusari::cuda::memory_stats(0);
      std::printf("RESULT mem_%s_peak %.0f\nRESULT mem_%s_end %.0f\n", name,
                  static_cast<double>(s.peak_requested_bytes), name,
                  static_cast<double>(s.requested_bytes));
    };
    kusari::Variable loss;
    phase("forward", [&] {
      model->cleargrads();
      loss = F::softmax_cross_entropy((*model)(kusari::Variable(x)), t);
    });
    phase("backward", [&] {
      kusari::BackwardOptions options;
      options.retain_graph = false;
      loss.backward(options);
      loss = kusari::Variable();
    });
    phase("update", [&] { opt.update(); });
  }
  if (!cuda) return 0;
  // The whole step recorded once (the learning rate is constant, so freezing it is right) and
  // replayed; the eager steps above made the momentum buffers and cuDNN's plans.
  try {
    kusari::cuda::Graph graph;
    graph.capture(device, step);
    const double graph_ms = time_steps(device, c.warmup, c.steps, [&] { graph.replay(); });
    std::printf("RESULT graph_ms %.6f\n", graph_ms);
    std::printf("RESULT graph_peak_bytes %.0f\n",
                static_cast<double>(kusari::cuda::memory_stats(0).peak_requested_bytes));
  } catch (const std::exception& e) {
    std::printf("graph capture failed: %s\n", e.what());
  }
  return 0;
}

/// This program's flags for a child running `row`.
std::string child_command(const std::string& self, const Config& c, const std::string& row) {
  std::ostringstream s;
  s << self << " --child " << row << " --arch " << c.arch << " --device " << c.device << " --batch "
    << c.batch << " --size " << c.size << " --steps " << c.steps << " --warmup " << c.warmup
    << " --tf32 " << c.tf32 << (c.memory_phases ? " --memory-phases" : "");
  return s.str();
}

std::string peer_args(const Config& c, const std::string& row, const std::string& mode) {
  std::ostringstream s;
  s << "--arch " << c.arch << " --device " << c.device << " --batch " << c.batch << " --size "
    << c.size << " --steps " << c.steps << " --warmup " << c.warmup << " --row " << row
    << " --mode " << mode << " --tf32 " << c.tf32 << (c.memory_phases ? " --memory-phases" : "");
  return s.str();
}

std::vector<std::string> split_rows(const std::string& rows) {
  std::vector<std::string> out;
  std::stringstream s(rows);
  std::string item;
  while (std::getline(s, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// One measured line of the table.
struct Figure {
  std::string row, what;
  double ms = 0, peak_bytes = 0;
};

/// The peer script (bench/peers/resnet50.py; kusari::bench::bench_dir).
std::string peer_script() {
  return kusari::bench::bench_dir() + "/peers/resnet50.py";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ResNet training steps, kusari beside PyTorch (torchvision)"};
  Config c;
  std::string child;
  app.add_option("--arch", c.arch, "resnet18, resnet34, resnet50, resnet101 or resnet152")
      ->capture_default_str()
      ->check(CLI::IsMember({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}));
  app.add_option("--device", c.device, "cuda (GPU 0) or cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--batch", c.batch, "Images per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--size", c.size, "Image height and width")
      ->capture_default_str()
      ->check(CLI::Range(32, 1 << 14));
  app.add_option("--steps", c.steps, "Timed steps per row")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", c.warmup, "Untimed steps before them")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option(
      "--rows", c.rows,
      "Comma list of f32-nchw, f32-cl, bf16-nchw, bf16-cl (default: all four on cuda, the float32 "
      "rows on cpu)");
  app.add_option("--tf32", c.tf32,
                 "TF32 tensor cores for float32 work, both sides: default (convolutions yes, "
                 "matrix products no, as both libraries default to), on or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "on", "off"}));
  app.add_flag("--compile", c.compile, "Also time the PyTorch peer under torch.compile");
  app.add_option("--python", c.python, "Interpreter that runs the PyTorch peer")
      ->capture_default_str();
  app.add_flag("--no-peer", c.no_peer, "Time kusari only");
  app.add_flag("--memory-phases", c.memory_phases,
               "Also print each side's peak GPU memory in the forward, the backward and the "
               "update of one step");
  app.add_option("--child", child, "(internal) run one row of kusari in this process")->group("");
  app.add_flag("--profile", c.profile, "(with --child) one step between profiler start and stop")
      ->group("");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_resnet50")) return 0;
  if (c.device == "cuda" && !kusari::cuda_available()) {
    std::fprintf(
        stderr,
        "bench_resnet50: --device cuda, but no CUDA device is available (use --device cpu)\n");
    return 1;
  }
  if (c.rows.empty())
    c.rows = c.device == "cuda" ? "f32-nchw,f32-cl,bf16-nchw,bf16-cl" : "f32-nchw,f32-cl";
  const std::vector<std::string> rows = split_rows(c.rows);
  for (const std::string& r : rows) {
    if (r != "f32-nchw" && r != "f32-cl" && r != "bf16-nchw" && r != "bf16-cl") {
      std::fprintf(stderr,
                   "bench_resnet50: --rows: unknown row '%s' (expected f32-nchw, f32-cl, "
                   "bf16-nchw, bf16-cl)\n",
                   r.c_str());
      return 1;
    }
  }
  if (!child.empty()) return run_child(c, child);

  const bool cuda = c.device == "cuda";
  std::printf(
      "%s training step (forward, backward, momentum SGD 0.9), batch %d, %dx%d, 1000 classes, %s, "
      "%d timed steps after %d warm-up\n",
      c.arch.c_str(), c.batch, c.size, c.size, cuda ? "one GPU" : "CPU", c.steps, c.warmup);
  if (cuda) {
    std::printf(
        "TF32 %s on both sides (kusari cuda::set_allow_tf32, torch cudnn/matmul allow_tf32; "
        "default: convolutions only); cuDNN algorithms chosen by timing on both sides "
        "(KUSARI_CUDNN_BENCHMARK=1, cudnn.benchmark)\n",
        c.tf32.c_str());
  } else {
    std::printf("(--tf32 has no effect on a CPU)\n");
  }
  std::vector<Figure> figures;
  std::map<std::string, double> best_kusari, best_torch, best_compile;  // img/s per dtype
  auto img_per_s = [&](double ms) { return c.batch * 1000.0 / ms; };
  auto keep_best = [&](std::map<std::string, double>& m, const std::string& row, double ms) {
    const std::string dt = row.substr(0, row.find('-'));
    m[dt] = std::max(m[dt], img_per_s(ms));
  };
  bool torchvision = true, compile_missing = false;
  std::vector<std::pair<std::string, std::map<std::string, double>>> phases;  // who, RESULTs
  for (const std::string& row : rows) {
    if (auto k = kusari::bench::try_run(child_command(argv[0], c, row), "kusari " + row)) {
      figures.push_back({row, "kusari eager", k->at("eager_ms"), k->at("peak_bytes")});
      if (k->count("mem_forward_peak")) phases.push_back({row + " kusari", *k});
      keep_best(best_kusari, row, k->at("eager_ms"));
      if (k->count("graph_ms")) {
        figures.push_back(
            {row, "kusari CUDA graph (whole step)", k->at("graph_ms"), k->at("graph_peak_bytes")});
        keep_best(best_kusari, row, k->at("graph_ms"));
      }
    }
    if (c.no_peer) continue;
    if (auto p = kusari::bench::try_run(c.python + " " + peer_script() + " " + peer_args(c, row, "eager"),
                             "pytorch " + row)) {
      figures.push_back({row, "pytorch eager", p->at("ms"), p->at("peak_bytes")});
      if (p->count("mem_forward_peak")) phases.push_back({row + " pytorch eager", *p});
      keep_best(best_torch, row, p->at("ms"));
      torchvision = torchvision && p->count("torchvision") && p->at("torchvision") == 1;
    }
    if (c.compile) {
      if (auto p = kusari::bench::try_run(c.python + " " + peer_script() + " " + peer_args(c, row, "compile"),
                               "torch.compile " + row)) {
        if (p->count("compile_unavailable")) {
          compile_missing = true;
        } else {
          figures.push_back({row, "torch.compile", p->at("ms"), p->at("peak_bytes")});
          keep_best(best_compile, row, p->at("ms"));
        }
      }
    }
  }
  if (compile_missing)
    std::printf("(torch.compile is not available in this PyTorch: no compile rows)\n");
  if (!c.no_peer && !torchvision) {
    std::printf("(torchvision is not installed: the peer defines the same ResNet itself)\n");
  }
  std::printf("%-10s %-32s %10s %10s %10s\n", "row", "", "img/s", "ms/step",
              cuda ? "peak MiB" : "peak RSS MiB");
  for (const Figure& f : figures) {
    std::printf("%-10s %-32s %10.1f %10.2f %10.0f\n", f.row.c_str(), f.what.c_str(),
                img_per_s(f.ms), f.ms, f.peak_bytes / (1024.0 * 1024.0));
  }
  if (!phases.empty()) {
    std::printf("\nGPU memory of one step by phase (MiB): the phase's peak / what is live after it\n");
    std::printf("%-22s %20s %20s %20s\n", "", "forward", "backward", "update");
    const auto mib = [](double b) { return b / (1024.0 * 1024.0); };
    for (const auto& [who, r] : phases) {
      std::printf("%-22s", who.c_str());
      for (const char* p : {"forward", "backward", "update"}) {
        const std::string k = std::string("mem_") + p;
        std::printf(" %9.0f / %8.0f", mib(r.at(k + "_peak")), mib(r.at(k + "_end")));
      }
      std::printf("\n");
    }
    std::printf("\n");
  }
  for (const auto& [dt, k] : best_kusari) {
    if (best_torch.count(dt)) {
      std::printf("ratio %s: best kusari / best pytorch eager (img/s) = %.3f\n", dt.c_str(),
                  k / best_torch.at(dt));
    }
    if (best_compile.count(dt)) {
      std::printf("ratio %s: best kusari / best torch.compile (img/s) = %.3f\n", dt.c_str(),
                  k / best_compile.at(dt));
    }
  }
  return kusari::bench::finish(argc, argv);
}
