// GPT training steps, kusari beside PyTorch in the same run: tokens per second, model FLOP
// utilisation (MFU, against the GPU's dense bf16 peak) and peak memory, for kusari eager and
// replayed as a CUDA graph, and for PyTorch eager (F.scaled_dot_product_attention) and under
// torch.compile (bench/peers/gpt.py, the same model written for PyTorch). With --attention it
// times scaled dot-product attention alone instead (forward + backward, causal, TFLOP/s) beside
// PyTorch's SDPA.
//
//   bench_gpt2                                    # GPT-2 small, seq 1024, bf16, one GPU
//   bench_gpt2 --device cpu --model tiny --seq 256 --batch 8 --dtype float32
//   bench_gpt2 --attention --head-dim 128
//
// Each kusari row runs in a process of its own (so its peak memory is its own); the peak is what
// kusari's arrays asked the CUDA pool for against torch.cuda.max_memory_allocated, or the peak
// resident set on a CPU. A step is AdamW's (beta2 0.95) on the mean cross-entropy of the next
// token, with the output layer tied to the token embedding; bf16 keeps float32 master weights on
// both sides (kusari: the model in bf16 with fp32 updates; PyTorch: autocast over float32
// weights). FLOPs per token: 6 N + 12 L C T (PaLM's estimate; N without the position table).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "bench_util.h"
#include "kusari/kusari.h"

namespace F = kusari::functions;

namespace {

struct Config {
  std::string model = "small", device = "cuda", dtype = "bfloat16", python = "python3";
  int batch = 8, seq = 1024, steps = 10, warmup = 3, head_dim = 128;
  int64_t vocab = 0;           // 0: the model's own (GPT-2's 50,257; 256 for tiny)
  int64_t vocab_multiple = 0;  // 0: the model's own (64: Note [Padded vocabulary])
  double peak_tflops = 989.0;  // H100 and H200 SXM, dense bf16
  bool no_peer = false, compile = true, attention = false;
};

kusari::models::GPTConfig model_config(const Config& c) {
  kusari::models::GPTConfig m = c.model == "tiny"     ? kusari::models::gpt_tiny_config()
                                : c.model == "medium" ? kusari::models::gpt2_medium_config()
                                                      : kusari::models::gpt2_small_config();
  m.block_size = std::max<int64_t>(m.block_size, c.seq);
  if (c.vocab > 0) m.vocab_size = c.vocab;
  if (c.vocab_multiple > 0) m.vocab_multiple = c.vocab_multiple;
  return m;
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

double time_steps(const kusari::Device& device, int warmup, int steps, const std::function<void()>& step) {
  for (int i = 0; i < warmup; ++i) step();
  device.synchronize();
  if (device.is_cuda()) kusari::cuda::reset_peak_memory_stats(device.index());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  device.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps * 1e3;
}

// One kusari row (eager, then graph on a GPU) in this process: RESULT eager_ms, peak_bytes,
// graph_ms, graph_peak_bytes, flops_per_token.
int run_child(const Config& c) {
  const bool cuda = c.device == "cuda";
  const kusari::Device device = cuda ? kusari::Device::cuda(0) : kusari::Device::cpu();
  const kusari::Dtype dtype = kusari::dtype_from_name(c.dtype);
  kusari::manual_seed(0);
  kusari::models::GPTConfig mc = model_config(c);
  auto model = std::make_shared<kusari::models::GPT>(mc);
  model->to_dtype(dtype);
  model->to_device(device);
  kusari::optimizers::AdamOptions ao;
  ao.alpha = 3e-4;
  ao.beta2 = 0.95;
  ao.weight_decay_rate = 0.1;
  kusari::optimizers::AdamW opt(ao);
  opt.setup(model);
  if (dtype != kusari::float32) opt.use_fp32_update();
  opt.use_multi_tensor_update();
  std::vector<int32_t> ids(static_cast<size_t>(c.batch * (c.seq + 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 2654435761u) % mc.vocab_size);
  kusari::Array all = kusari::Array::from_vector(ids, kusari::Shape{c.batch, c.seq + 1}, device);
  kusari::Array x = all.at({kusari::Slice(), kusari::Slice(0, c.seq)}).copy();
  kusari::Array t = all.at({kusari::Slice(), kusari::Slice(1, c.seq + 1)}).copy();
  auto step = [&] {
    opt.update([&] { return model->forward_batch({kusari::Variable(x), kusari::Variable(t)}); });
  };
  std::printf("RESULT params %lld\n", static_cast<long long>(model->count_params()));
  std::printf("RESULT flops_per_token %.6e\n", model->flops_per_token(c.seq));
  const double eager_ms = time_steps(device, c.warmup, c.steps, step);
  std::printf("RESULT eager_ms %.6f\n", eager_ms);
  std::printf("RESULT peak_bytes %.0f\n",
              cuda ? static_cast<double>(kusari::cuda::memory_stats(0).peak_requested_bytes) : peak_rss_bytes());
  std::fflush(stdout);
  if (!cuda) return 0;
  try {
    // Forward and backward recorded once and replayed; the update runs eagerly (Adam's bias
    // correction changes every step), as the trainer's --cuda-graph does.
    kusari::Variable loss;
    kusari::cuda::Graph graph;
    graph.capture(device, [&] {
      model->cleargrads();
      loss = model->forward_batch({kusari::Variable(x), kusari::Variable(t)});
      kusari::BackwardOptions o;
      o.retain_graph = false;
      loss.backward(o);
    });
    const double graph_ms = time_steps(device, c.warmup, c.steps, [&] {
      graph.replay();
      opt.update();
    });
    std::printf("RESULT graph_ms %.6f\n", graph_ms);
    std::printf("RESULT graph_peak_bytes %.0f\n", static_cast<double>(kusari::cuda::memory_stats(0).peak_requested_bytes));
  } catch (const std::exception& e) {
    std::printf("graph capture failed: %s\n", e.what());
  }
  return 0;
}

// Attention alone: forward + backward of causal attention at (batch, heads, T, head_dim), T from
// 1k to 16k with batch * T = 16k tokens, TFLOP/s counting 4 T^2 D per head forward (two
// products) and 2.5 times that for forward + backward, halved for the causal mask.
int run_attention(const Config& c) {
  const bool cuda = c.device == "cuda";
  const kusari::Device device = cuda ? kusari::Device::cuda(0) : kusari::Device::cpu();
  const kusari::Dtype dtype = kusari::dtype_from_name(c.dtype);
  const int64_t heads = 2048 / c.head_dim;
  for (int64_t T : {1024, 2048, 4096, 8192, 16384}) {
    const int64_t B = std::max<int64_t>(1, 16384 / T);
    kusari::Array q = kusari::Array::uniform({B, heads, T, c.head_dim}, -1, 1, kusari::float32, device).astype(dtype);
    kusari::Array k = kusari::Array::uniform({B, heads, T, c.head_dim}, -1, 1, kusari::float32, device).astype(dtype);
    kusari::Array v = kusari::Array::uniform({B, heads, T, c.head_dim}, -1, 1, kusari::float32, device).astype(dtype);
    kusari::Array gy = kusari::Array::uniform({B, heads, T, c.head_dim}, -1, 1, kusari::float32, device).astype(dtype);
    kusari::Variable vq(q, true), vk(k, true), vv(v, true);
    F::AttentionOptions o;
    o.causal = true;
    double ms = 0;
    try {
      ms = time_steps(device, 2, c.steps, [&] {
        vq.cleargrad();
        vk.cleargrad();
        vv.cleargrad();
        kusari::Variable y = F::scaled_dot_product_attention(vq, vk, vv, o);
        y.set_grad(gy);
        y.backward();
      });
    } catch (const std::exception& e) {
      std::printf("attention at T %lld failed: %s\n", static_cast<long long>(T), e.what());
      continue;
    }
    const double flops = 4.0 * B * heads * T * T * c.head_dim * 2.5 * 0.5;
    std::printf("RESULT attn_tflops_%lld %.6f\n", static_cast<long long>(T), flops / (ms * 1e-3) / 1e12);
  }
  return 0;
}

std::string common_args(const Config& c) {
  std::ostringstream s;
  s << "--model " << c.model << " --device " << c.device << " --dtype " << c.dtype << " --batch " << c.batch
    << " --seq " << c.seq << " --steps " << c.steps << " --warmup " << c.warmup << " --head-dim " << c.head_dim;
  if (c.vocab > 0) s << " --vocab " << c.vocab;
  if (c.vocab_multiple > 0) s << " --vocab-multiple " << c.vocab_multiple;
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT training steps (or attention alone), kusari beside PyTorch"};
  Config c;
  bool child = false;
  app.add_option("--model", c.model, "tiny, small (GPT-2 small, 124M) or medium")
      ->capture_default_str()->check(CLI::IsMember({"tiny", "small", "medium"}));
  app.add_option("--device", c.device, "cuda (GPU 0) or cpu")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", c.dtype, "float32 or bfloat16")
      ->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_option("--batch", c.batch, "Sequences per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq", c.seq, "Tokens per sequence")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", c.steps, "Timed steps")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", c.warmup, "Untimed steps first")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--vocab", c.vocab,
                 "Vocabulary size (0: the model's own; e.g. 50304, GPT-2's padded to 64)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--vocab-multiple", c.vocab_multiple,
                 "kusari's embedding rows: the vocabulary rounded up to a multiple of this (0: the "
                 "model's, 64)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--peak-tflops", c.peak_tflops, "The GPU's dense bf16 peak, for MFU")->capture_default_str();
  app.add_flag("--attention", c.attention, "Time attention alone (forward + backward, causal, T 1k to 16k)");
  app.add_option("--head-dim", c.head_dim, "With --attention: the head dim (64 or 128)")
      ->capture_default_str()->check(CLI::IsMember({64, 128}));
  app.add_option("--python", c.python, "Interpreter that runs the PyTorch peer")->capture_default_str();
  app.add_flag("--no-peer", c.no_peer, "Time kusari only");
  app.add_flag("!--no-compile", c.compile, "Leave out the torch.compile row");
  app.add_flag("--child", child, "(internal) run kusari's rows in this process")->group("");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_gpt2")) return 0;
  if (c.device == "cuda" && !kusari::cuda_available()) {
    std::fprintf(stderr, "bench_gpt2: --device cuda, but no CUDA device is available (use --device cpu)\n");
    return 1;
  }
  if (child) return c.attention ? run_attention(c) : run_child(c);

  const std::string self = kusari::bench::command_line(1, argv);
  const std::string args = common_args(c) + (c.attention ? " --attention" : "");
  auto ours = kusari::bench::try_run(self + " --child " + args, "kusari (" + std::string(c.attention ? "attention" : "step") + ")");
  std::optional<std::map<std::string, double>> torch_eager, torch_compiled;
  if (!c.no_peer) {
    torch_eager = kusari::bench::try_peer(c.python, "gpt.py", args + " --mode eager");
    if (c.compile && c.device == "cuda") torch_compiled = kusari::bench::try_peer(c.python, "gpt.py", args + " --mode compile");
  }
  auto get = [](const std::optional<std::map<std::string, double>>& r, const std::string& key) -> std::optional<double> {
    if (!r || !r->count(key)) return std::nullopt;
    return r->at(key);
  };
  if (c.attention) {
    std::printf("causal attention, forward + backward, head dim %d, %s, %s; TFLOP/s (ratio: kusari / PyTorch's SDPA)\n",
                c.head_dim, c.dtype.c_str(), c.device == "cuda" ? "one GPU" : "CPU");
    std::printf("%8s %12s %12s %8s\n", "T", "kusari", "PyTorch", "ratio");
    for (int T : {1024, 2048, 4096, 8192, 16384}) {
      const std::string key = "attn_tflops_" + std::to_string(T);
      auto a = get(ours, key), b = get(torch_eager, key);
      std::optional<double> r;
      if (a && b) r = *a / *b;
      std::printf("%8d %12s %12s %8s\n", T, kusari::bench::cell(a).c_str(), kusari::bench::cell(b).c_str(),
                  kusari::bench::cell(r).c_str());
    }
    return kusari::bench::finish(argc, argv);
  }
  const double tokens = static_cast<double>(c.batch) * c.seq;
  const std::optional<double> fpt = get(ours, "flops_per_token");
  std::printf("GPT %s (%s parameters), batch %d x seq %d, %s, %s, AdamW; %d timed steps after %d warm-up\n",
              c.model.c_str(), kusari::bench::cell(get(ours, "params"), 0).c_str(), c.batch, c.seq, c.dtype.c_str(),
              c.device == "cuda" ? "one GPU" : "CPU", c.steps, c.warmup);
  std::printf("%-16s %12s %12s %8s %12s %14s\n", "row", "ms/step", "tokens/s", "MFU", "peak GB", "vs compile");
  std::optional<double> compile_tps;
  if (auto ms = get(torch_compiled, "step_ms")) compile_tps = tokens / (*ms * 1e-3);
  auto row = [&](const char* name, std::optional<double> ms, std::optional<double> peak) {
    std::optional<double> tps, mfu, vs, gb;
    if (ms) tps = tokens / (*ms * 1e-3);
    if (tps && fpt && c.device == "cuda") mfu = *tps * *fpt / (c.peak_tflops * 1e12);
    if (tps && compile_tps) vs = *tps / *compile_tps;
    if (peak) gb = *peak / 1e9;
    std::printf("%-16s %12s %12s %8s %12s %14s\n", name, kusari::bench::cell(ms).c_str(),
                kusari::bench::cell(tps, 0).c_str(), kusari::bench::cell(mfu).c_str(), kusari::bench::cell(gb).c_str(),
                kusari::bench::cell(vs).c_str());
  };
  row("kusari eager", get(ours, "eager_ms"), get(ours, "peak_bytes"));
  if (c.device == "cuda") row("kusari graph", get(ours, "graph_ms"), get(ours, "graph_peak_bytes"));
  row("PyTorch eager", get(torch_eager, "step_ms"), get(torch_eager, "peak_bytes"));
  if (c.device == "cuda") row("torch.compile", get(torch_compiled, "step_ms"), get(torch_compiled, "peak_bytes"));
  if (auto a = get(ours, "eager_ms"), b = get(torch_eager, "step_ms"); a && b) {
    std::printf("kusari eager / PyTorch eager, time per step: %.3f (below 1: kusari faster)\n", *a / *b);
  }
  return kusari::bench::finish(argc, argv);
}
