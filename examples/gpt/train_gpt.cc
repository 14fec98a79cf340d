// A GPT language model (models::GPT: GPT-2's architecture) trained on any text file, on one CPU
// or GPU or data-parallel under mpiexec, then sampled from a prompt:
//
//   ./train_gpt                                              # GPT tiny on the GPL-3 text, bytes, CPU
//   ./train_gpt --text corpus.txt --tokenizer gpt2 --bpe-dir gpt2 --model small --gpu --dtype bfloat16
//   mpiexec -n 8 ./train_gpt --text corpus.txt --gpu --overlap   # one GPU per process
//   ./train_gpt --load result/gpt.npz -i 0 --prompt "The licenses" --generate 200
//
// The text is split 90/10 into training and validation tokens; training batches are windows of
// --seq-len tokens at random offsets, the targets the same windows one token later. The learning
// rate warms up linearly, then follows a cosine down to a tenth (GPT-2 and nanoGPT's schedule).
// The log has the loss, the validation loss and the tokens per second. The lines that make the
// single-process program multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "tokenizer.h"

namespace F = kusari::functions;
namespace E = kusari::training::extensions;
using kusari::Array;
using kusari::Variable;

namespace {

// Windows of `len` tokens of [begin, end) of the token stream, one every `stride` tokens; an
// example is {ids (len,), the next ids (len,)}.
class TokenWindows : public kusari::Dataset {
 public:
  TokenWindows(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end, int64_t len,
               int64_t stride)
      : tokens_(std::move(tokens)), begin_(begin), end_(end), len_(len), stride_(stride) {}
  int64_t size() const override { return end_ - begin_ <= len_ ? 0 : (end_ - begin_ - len_ - 1) / stride_ + 1; }
  kusari::Example get_example(int64_t i) const override {
    const int32_t* p = tokens_->data() + begin_ + i * stride_;
    return {Array::from_vector(std::vector<int32_t>(p, p + len_), kusari::Shape{len_}),
            Array::from_vector(std::vector<int32_t>(p + 1, p + len_ + 1), kusari::Shape{len_})};
  }

 private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_, end_, len_, stride_;
};

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KUSARI_CHECK(f.good(), IOError, "train_gpt: cannot read the text file '", path, "' (give one with --text)");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const CLI::Validator kPositive(
    [](std::string& v) { return std::atof(v.c_str()) > 0 ? std::string() : "must be positive, got " + v; }, "POSITIVE");
const CLI::Validator kNonNegative(
    [](std::string& v) { return std::atof(v.c_str()) >= 0 ? std::string() : "must be 0 or more, got " + v; }, ">=0");

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kusari example: train a GPT on a text file, data-parallel, then sample from it"};
  std::string text_path = "/usr/share/common-licenses/GPL-3", tokenizer_name = "bytes", bpe_dir = "gpt2",
              model_name = "tiny", communicator = "pure_nccl", out = "result", resume, load, dtype_name = "float32",
              prompt = "\n";
  int64_t batchsize = 8, seq_len = 128, iterations = 1000, accumulate = 1, warmup = 100, eval_interval = 100,
          eval_batches = 8, log_interval = 10, snapshot_interval = 0, generate = 0, top_k = 40, seed = 0;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  double lr = 1e-3, min_lr = -1, weight_decay = 0.1, grad_clip = 1.0, dropout = 0.0, temperature = 0.8;
  double bucket_mb = 25;
  bool gpu = false, overlap = false, noplot = false, elastic = false;
  int zero = 0;
  app.add_option("--text", text_path, "The text to learn (any file; 90% training, 10% validation)")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizer_name, "bytes (256 ids) or gpt2 (GPT-2's BPE, 50257 ids, from --bpe-dir)")
      ->capture_default_str()->check(CLI::IsMember({"bytes", "gpt2"}));
  app.add_option("--bpe-dir", bpe_dir, "With --tokenizer gpt2: the folder of encoder.json and vocab.bpe "
                 "(scripts/get_gpt2_bpe.sh makes it)")->capture_default_str();
  app.add_option("--model", model_name, "tiny (6 layers, 384 features), small (GPT-2 small, 124M) or medium "
                 "(GPT-2 medium, 350M)")->capture_default_str()->check(CLI::IsMember({"tiny", "small", "medium"}));
  app.add_option("--n-layer", n_layer, "Layers (0: the model's)")->check(kNonNegative);
  app.add_option("--n-head", n_head, "Attention heads (0: the model's)")->check(kNonNegative);
  app.add_option("--n-embd", n_embd, "Features (0: the model's)")->check(kNonNegative);
  app.add_option("--block-size", block_size, "Longest sequence, the position table (0: the model's)")
      ->check(kNonNegative);
  app.add_option("-b,--batchsize", batchsize, "Sequences in each mini-batch (per process)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--seq-len", seq_len, "Tokens per training sequence (at most the block size)")
      ->capture_default_str()->check(kPositive);
  app.add_option("-i,--iterations", iterations, "Optimizer steps (0: no training, e.g. to sample a --load-ed model)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--accumulate", accumulate, "Micro-batches per step (gradient accumulation)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--lr", lr, "The peak learning rate (Adam's alpha)")->capture_default_str()->check(kPositive);
  app.add_option("--min-lr", min_lr, "The rate the cosine ends at (default: lr / 10)");
  app.add_option("--warmup", warmup, "Iterations of linear warm-up")->capture_default_str()->check(kNonNegative);
  app.add_option("--weight-decay", weight_decay, "AdamW's decoupled weight decay, as PyTorch's: lr_t * wd * p per step (of the matrices; not of biases and norms)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--grad-clip", grad_clip, "Largest global gradient norm (0: no clipping)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--dropout", dropout, "Dropout")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  app.add_option("--dtype", dtype_name, "float32, or bfloat16 / float16 for mixed precision")
      ->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("--communicator", communicator, "Type of communicator (on CPUs, a GPU one falls back to naive)")
      ->capture_default_str()->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_flag("--overlap", overlap, "Average the gradients in buckets while backward runs (with --zero 2, "
               "reduce-scatter them so)");
  app.add_option("--zero", zero,
                 "Shard the optimizer's state over the processes (1), the gradients too (2), and "
                 "the parameters too (3, gathered while used); 0: every process holds all of it "
                 "(docs/sharding.md)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_option("--bucket-mb", bucket_mb,
                 "MiB of a bucket of the overlapped averaging, of a chunk of the sharded "
                 "step, and the least of a group of parameters gathered at once with --zero 3")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--eval-interval", eval_interval, "Iterations between validations")
      ->capture_default_str()->check(kPositive);
  app.add_option("--eval-batches", eval_batches, "Validation batches per validation (per process)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--log-interval", log_interval, "Iterations between log entries")
      ->capture_default_str()->check(kPositive);
  app.add_option("--snapshot-interval", snapshot_interval, "Iterations between snapshots (0: at the end)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("-o,--out", out, "Directory of the log, the snapshots and the model (gpt.npz)")
      ->capture_default_str();
  app.add_option("-r,--resume", resume,
                 "Resume from a snapshot (each process loads its own file under mpiexec); a folder (or the --out "
                 "folder): its newest complete snapshot set, or a fresh start when there is none");
  app.add_flag("--elastic", elastic,
               "Every process takes its part of each global batch of one order of the whole text "
               "(DistributedIterator), so that a snapshot resumes on another number of processes (kusari-run)");
  app.add_option("--load", load, "Start from a model file written by an earlier run (out/gpt.npz)");
  app.add_option("--prompt", prompt, "Text to continue after training")->capture_default_str();
  app.add_option("--generate", generate, "Tokens to sample after the prompt (0: none)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--temperature", temperature, "Sampling temperature (0: the likeliest token)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--top-k", top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str()->check(kNonNegative);
  std::string encode_text;
  app.add_option("--encode", encode_text, "Print the token ids of this text with the tokenizer, then exit");
  app.add_option("--seed", seed, "Seed of the initial weights, the windows and the sampling")
      ->capture_default_str()->check(kNonNegative);
  app.add_flag("--noplot", noplot, "Disable PlotReport extension");
  CLI11_PARSE(app, argc, argv);

  kusari::models::GPTConfig config = model_name == "small"    ? kusari::models::gpt2_small_config()
                                     : model_name == "medium" ? kusari::models::gpt2_medium_config()
                                                              : kusari::models::gpt_tiny_config();
  if (n_layer > 0) config.n_layer = n_layer;
  if (n_head > 0) config.n_head = n_head;
  if (n_embd > 0) config.n_embd = n_embd;
  if (block_size > 0) config.block_size = block_size;
  config.dropout = dropout;
  if (config.n_embd % config.n_head != 0) {
    std::fprintf(stderr, "Error: --n-embd %lld is not a multiple of --n-head %lld\n",
                 static_cast<long long>(config.n_embd), static_cast<long long>(config.n_head));
    return 1;
  }
  if (iterations > 0 && seq_len > config.block_size) {
    std::fprintf(stderr, "Error: --seq-len %lld is longer than the block size %lld (raise --block-size)\n",
                 static_cast<long long>(seq_len), static_cast<long long>(config.block_size));
    return 1;
  }
  const bool cpu_communicator = communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(stderr, "Error: 'naive' communicator does not support GPU; use e.g. --communicator pure_nccl\n");
    return 1;
  }
  if (!gpu && !cpu_communicator) communicator = "naive";
  if (tokenizer_name == "gpt2" && !gpt::have_gpt2_tokenizer()) {
    std::fprintf(stderr, "Error: this build has no GPT-2 tokenizer (PCRE2 was not found: install libpcre2-dev and "
                         "rebuild); use --tokenizer bytes\n");
    return 1;
  }
  if (min_lr < 0) min_lr = lr / 10;
  if (kusari::only_check_arguments("train_gpt")) return 0;
  if (app.count("--encode")) {
    std::unique_ptr<gpt::Tokenizer> t = gpt::make_tokenizer(tokenizer_name, bpe_dir);
    std::vector<int32_t> ids = t->encode(encode_text);
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
    std::printf("\n");
    return 0;
  }

  auto comm = kusari::mn::create_communicator(communicator);                  // (multi-node)
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  const kusari::Dtype dtype = kusari::dtype_from_name(dtype_name);

  // Every process reads and tokenizes the (local) text.                         (multi-node)
  std::unique_ptr<gpt::Tokenizer> tokenizer = gpt::make_tokenizer(tokenizer_name, bpe_dir);
  config.vocab_size = tokenizer->vocab_size();
  auto tokens = std::make_shared<std::vector<int32_t>>(tokenizer->encode(read_text(text_path)));
  const int64_t n_tokens = static_cast<int64_t>(tokens->size()), split = n_tokens * 9 / 10;
  auto train_all = std::make_shared<TokenWindows>(tokens, 0, split, seq_len, 1);
  auto val_all = std::make_shared<TokenWindows>(tokens, split, n_tokens, seq_len, seq_len);
  if (iterations > 0 && (train_all->size() < batchsize || val_all->size() < 1)) {
    std::fprintf(stderr, "Error: '%s' has %lld tokens: too few for windows of --seq-len %lld (at least %lld are "
                         "needed)\n", text_path.c_str(), static_cast<long long>(n_tokens),
                 static_cast<long long>(seq_len), static_cast<long long>(10 * (seq_len + batchsize) + 10));
    return 1;
  }
  // With --elastic every process keeps every training window (Note [Distributed iterator]).
  auto train = elastic ? std::shared_ptr<kusari::Dataset>(train_all)
                       : kusari::mn::scatter_dataset(train_all, comm, 0, true, static_cast<uint64_t>(seed));  // (multi-node)
  auto val = kusari::mn::scatter_dataset(val_all, comm, 0, true, static_cast<uint64_t>(seed));
  kusari::mn::check_same_settings(comm,                                        // (multi-node)
                                  {{"--model", model_name}, {"--batchsize", std::to_string(batchsize)},
                                   {"--seq-len", std::to_string(seq_len)}, {"--iterations", std::to_string(iterations)},
                                   {"--accumulate", std::to_string(accumulate)}, {"--seed", std::to_string(seed)},
                                   {"tokens of the text", std::to_string(n_tokens)}, {"--dtype", dtype_name},
                                   {"--communicator", communicator}, {"--gpu", gpu ? "on" : "off"},
                                   {"--overlap", overlap ? "on" : "off"}, {"--zero", std::to_string(zero)},
                                   {"--bucket-mb", std::to_string(bucket_mb)}, {"--elastic", elastic ? "on" : "off"}},
                                  "train_gpt");

  kusari::manual_seed(static_cast<uint64_t>(seed));
  auto model = std::make_shared<kusari::models::GPT>(config);
  if (!load.empty()) kusari::load_npz(load, *model);
  model->to_dtype(dtype);  // (mixed precision; the layer norms keep float32)
  model->to_device(device);
  if (comm->rank() == 0) {
    std::printf("==========================================\nNum process (COMM_WORLD): %d\n%sUsing %s communicator\n"
                "Model: GPT %s: %lld layers, %lld heads, %lld features, block %lld, %lld parameters\n"
                "Tokenizer: %s (%lld ids); %s: %lld tokens\n"
                "Batch: %lld sequences of %lld tokens x %lld micro-batches x %d processes = %lld tokens per step\n"
                "Iterations: %lld, lr %g (warm-up %lld, cosine to %g), dtype %s\n"
                "==========================================\n",
                comm->size(), gpu ? "Using GPUs\n" : "", communicator.c_str(), model_name.c_str(),
                static_cast<long long>(config.n_layer), static_cast<long long>(config.n_head),
                static_cast<long long>(config.n_embd), static_cast<long long>(config.block_size),
                static_cast<long long>(model->count_params()), tokenizer->name().c_str(),
                static_cast<long long>(tokenizer->vocab_size()), text_path.c_str(), static_cast<long long>(n_tokens),
                static_cast<long long>(batchsize), static_cast<long long>(seq_len),
                static_cast<long long>(accumulate), comm->size(),
                static_cast<long long>(batchsize * seq_len * accumulate * comm->size()),
                static_cast<long long>(iterations), lr, static_cast<long long>(warmup), min_lr, dtype_name.c_str());
    std::fflush(stdout);
  }

  if (iterations > 0) {
    kusari::optimizers::AdamOptions adam;
    adam.alpha = lr;
    adam.beta2 = 0.95;
    adam.weight_decay_rate = 0.0;  // (scheduled below)
    kusari::mn::MultiNodeOptimizerOptions mn_options;                          // (multi-node)
    mn_options.overlap = overlap;
    mn_options.zero_stage = zero;                                              // (multi-node)
    mn_options.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20)));
    auto optimizer = kusari::mn::create_multi_node_optimizer(
        std::make_shared<kusari::optimizers::AdamW>(adam), comm, mn_options);
    optimizer->setup(model);
    // Decay the matrices only (embeddings included), not the biases or the layer norms' scales.
    optimizer->set_hyperparam_where("weight_decay_rate", 0.0, kusari::optimizers::is_bias_or_norm);
    if (grad_clip > 0) optimizer->add_hook(std::make_shared<kusari::optimizers::GradientClipping>(grad_clip));
    if (dtype != kusari::float32) {
      optimizer->use_fp32_update();                                            // (mixed precision)
      if (dtype == kusari::float16) optimizer->loss_scaling();
    }
    std::shared_ptr<kusari::Iterator> train_iter;
    if (elastic) {
      kusari::mn::DistributedIteratorOptions order;
      order.seed = static_cast<uint64_t>(seed);
      train_iter = std::make_shared<kusari::mn::DistributedIterator>(train, batchsize, comm, order);
    } else {
      train_iter = std::make_shared<kusari::SerialIterator>(train, batchsize, true, true,
                                                            static_cast<uint64_t>(seed + comm->rank()));
    }
    auto val_iter = std::make_shared<kusari::SerialIterator>(val, batchsize, true, true, static_cast<uint64_t>(seed));
    auto updater = std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer, device);
    updater->set_accumulation_steps(accumulate);
    kusari::training::Trainer trainer(updater, kusari::training::interval(iterations, "iteration"), out);
    E::WarmupSchedule schedule;  // in iterations (IterationShift)
    schedule.peak = lr;
    schedule.warmup_start = 0.0;
    schedule.warmup_epochs = static_cast<double>(std::min(warmup, iterations));
    schedule.decay = E::WarmupSchedule::Decay::kCosine;
    schedule.total_epochs = std::max(static_cast<double>(iterations), schedule.warmup_epochs + 1);
    schedule.final_value = min_lr;
    trainer.extend(std::make_shared<E::IterationShift>("alpha", schedule));
    if (weight_decay > 0) {
      // kusari's AdamW (Chainer's) decays by eta * rate * p per step, not scaled by alpha: the
      // rate follows the same schedule times --weight-decay, which makes the decay PyTorch's
      // lr_t * weight_decay * p.
      E::WarmupSchedule decay = schedule;
      decay.peak = lr * weight_decay;
      decay.final_value = min_lr * weight_decay;
      trainer.extend(std::make_shared<E::IterationShift>("weight_decay_rate", decay), "IterationShift(decay)");
    }
    // Validation: the mean loss of --eval-batches windows (the same ones each time).
    auto evaluator = std::make_shared<E::Evaluator>(
        std::make_shared<kusari::SerialIterator>(
            std::make_shared<kusari::SubDataset>(val, 0, std::min<int64_t>(val->size(), eval_batches * batchsize)),
            batchsize, false, false),
        model, nullptr, device);
    trainer.extend(kusari::mn::create_multi_node_evaluator(evaluator, comm), "",
                   kusari::training::interval(eval_interval, "iteration"));
    const int64_t snapshot_every = snapshot_interval > 0 ? snapshot_interval : iterations;
    if (comm->size() == 1) {
      trainer.extend(E::snapshot(), "", kusari::training::interval(snapshot_every, "iteration"));
    } else {
      trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",  // (multi-node)
                     kusari::training::interval(snapshot_every, "iteration"));
    }
    if (comm->rank() == 0) {
      // tokens/s over each log interval (every process's tokens), from the entries' clock.
      const double tokens_per_step = static_cast<double>(batchsize * seq_len * accumulate * comm->size());
      auto log = std::make_shared<E::LogReport>(std::nullopt, kusari::training::interval(log_interval, "iteration"));
      auto last = std::make_shared<std::pair<double, double>>(0.0, 0.0);  // (iteration, elapsed_time)
      log->set_postprocess([last, tokens_per_step](E::LogReport::Entry& entry) {
        const double it = entry["iteration"], t = entry["elapsed_time"];
        if (t > last->second) entry["tokens/s"] = (it - last->first) * tokens_per_step / (t - last->second);
        *last = {it, t};
      });
      trainer.extend(log);
      trainer.extend(std::make_shared<E::PrintReport>(std::vector<std::string>{
          "iteration", "main/loss", "validation/main/loss", "lr", "tokens/s", "elapsed_time"}));
      trainer.extend(E::observe_lr(), "", kusari::training::interval(log_interval, "iteration"));
      if (!noplot) {
        trainer.extend(std::make_shared<E::PlotReport>(std::vector<std::string>{"main/loss", "validation/main/loss"},
                                                       "iteration", kusari::training::interval(eval_interval, "iteration"),
                                                       "loss.png"));
      }
      trainer.extend(std::make_shared<E::ProgressBar>());
    }
    if (kusari::mn::names_snapshot_folder(resume, out)) {
      // The newest complete snapshot set (of any number of processes with --elastic).
      kusari::mn::load_newest_snapshot_set(resume, trainer, comm);
    } else if (!resume.empty()) {
      kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
    }
    trainer.run();
    // With --zero 3 the parameters live in the shards: gather them whole on every process, so
    // that rank 0 alone may save them and generate (after the optimizer is gone, too).
    std::dynamic_pointer_cast<kusari::mn::MultiNodeOptimizer>(optimizer)->summon_full_parameters();
    if (comm->rank() == 0) {
      kusari::save_npz(out + "/gpt.npz", *model);
      std::printf("Saved the model to %s/gpt.npz\n", out.c_str());
    }
  }

  if (generate > 0 && comm->rank() == 0) {
    std::vector<int32_t> ids = tokenizer->encode(prompt);
    if (ids.empty()) ids.push_back(0);
    std::vector<int64_t> ids64(ids.begin(), ids.end());
    Array start = Array::from_vector(ids64, kusari::Shape{1, static_cast<int64_t>(ids64.size())});
    kusari::Generator gen(static_cast<uint64_t>(seed));
    Array outp = model->generate(start, generate, temperature, top_k, &gen);
    std::printf("---- sample (%lld tokens, temperature %g, top-k %lld) ----\n%s\n----\n",
                static_cast<long long>(generate), temperature, static_cast<long long>(top_k),
                tokenizer->decode(outp.to_vector<int64_t>()).c_str());
  }
  return 0;
}
