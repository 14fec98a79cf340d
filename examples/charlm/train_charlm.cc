// A character-level LSTM language model on lines of text, trained data-parallel. The network is
// dynamic: the loop over time runs as long as the longest line of each batch, and the batch
// shrinks as its shorter lines end (the lines are sorted by decreasing length), so nothing is
// padded and no step computes on a finished line. Run it as one process, or on many with
//
//   mpiexec -n 2 ./train_charlm                          # CPUs, "naive" communicator
//   mpiexec -n 8 ./train_charlm --gpu                     # one GPU per process, "pure_nccl"
//   ./train_charlm --data /usr/share/common-licenses/GPL-2 -e 10
//
// The default text is the GNU GPL version 3, which every Debian system installs (base-files).
// The lines that make the single-process program multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
namespace E = kusari::training::extensions;
using kusari::Array;
using kusari::Variable;

// Ids are bytes; 0 never occurs in text, so it marks the start of a line, and '\n' ends it.
constexpr int64_t kVocab = 256;
constexpr int32_t kStart = 0;

// The non-empty lines of a text file, each an int32 array: start id, the line's bytes, '\n'.
class LineDataset : public kusari::Dataset {
 public:
  LineDataset(const std::string& path, int64_t max_lines) {
    std::ifstream file(path, std::ios::binary);
    KUSARI_CHECK(file.good(), IOError, "train_charlm: cannot read the text file '", path,
                 "' (give another with --data)");
    std::string line;
    while (std::getline(file, line) && (max_lines <= 0 || static_cast<int64_t>(lines_.size()) < max_lines)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::vector<int32_t> ids{kStart};
      for (unsigned char c : line) ids.push_back(c);
      ids.push_back('\n');
      lines_.push_back(std::move(ids));
    }
    KUSARI_CHECK(lines_.size() >= 20, ValueError, "train_charlm: '", path, "' has ", lines_.size(),
                 " non-empty lines; at least 20 are needed");
  }
  int64_t size() const override { return static_cast<int64_t>(lines_.size()); }
  kusari::Example get_example(int64_t i) const override {
    return {Array::from_vector(lines_[i], kusari::Shape{static_cast<int64_t>(lines_[i].size())})};
  }

 private:
  std::vector<std::vector<int32_t>> lines_;
};

// Every `every`-th example of `base` (or every other one), in order.
class StrideDataset : public kusari::Dataset {
 public:
  StrideDataset(std::shared_ptr<kusari::Dataset> base, int64_t every, bool take)
      : base_(std::move(base)), every_(every), take_(take) {}
  int64_t size() const override {
    const int64_t taken = (base_->size() + every_ - 1) / every_;
    return take_ ? taken : base_->size() - taken;
  }
  kusari::Example get_example(int64_t i) const override {
    return base_->get_example(take_ ? i * every_ : i + i / (every_ - 1) + 1);
  }

 private:
  std::shared_ptr<kusari::Dataset> base_;
  int64_t every_;
  bool take_;
};

// Embedding -> LSTM -> output layer over the 256 byte ids. forward_batch takes a batch of lines
// sorted by decreasing length and returns the mean cross entropy of predicting each next byte.
class CharLM : public kusari::Chain {
 public:
  CharLM(int64_t n_embed, int64_t n_units) {
    embed = add_link("embed", std::make_shared<L::EmbedID>(kVocab, n_embed));
    lstm = add_link("lstm", std::make_shared<L::LSTM>(n_embed, n_units));
    out = add_link("out", std::make_shared<L::Linear>(n_units, kVocab));
  }
  Variable forward_batch(const std::vector<Variable>& lines) override {
    std::vector<std::vector<int32_t>> ids;
    for (const Variable& line : lines) ids.push_back(line.array().to_vector<int32_t>());
    const kusari::Device device = lines[0].array().device();
    lstm->reset_state();
    std::vector<Variable> hs;
    std::vector<int32_t> targets;
    // Step t reads byte t of the lines longer than t + 1 and predicts byte t + 1; the lines are
    // sorted, so those are the first `batch` lines and the LSTM keeps the state of the others.
    for (size_t t = 0; t + 1 < ids[0].size(); ++t) {
      int64_t batch = 0;
      while (batch < static_cast<int64_t>(ids.size()) && ids[batch].size() > t + 1) ++batch;
      std::vector<int32_t> x(batch);
      for (int64_t i = 0; i < batch; ++i) {
        x[i] = ids[i][t];
        targets.push_back(ids[i][t + 1]);
      }
      hs.push_back(lstm->forward(embed->forward(Array::from_vector(x, kusari::Shape{batch}, device))));
    }
    // One output layer and one softmax over all the steps' states: the mean over every token.
    Variable y = out->forward(F::concat(hs, 0));
    Variable loss = F::softmax_cross_entropy(
        y, Array::from_vector(targets, kusari::Shape{static_cast<int64_t>(targets.size())}, device));
    kusari::Observation observation;
    observation.emplace("loss", loss.data());
    kusari::report(observation, static_cast<const Link*>(this));
    return loss;
  }

 private:
  std::shared_ptr<L::EmbedID> embed;
  std::shared_ptr<L::LSTM> lstm;
  std::shared_ptr<L::Linear> out;
};

// Flag checks whose messages name the value and what is expected.
const CLI::Validator kPositive(
    [](std::string& v) { return std::atof(v.c_str()) > 0 ? std::string() : "must be positive, got " + v; }, "POSITIVE");
const CLI::Validator kNonNegative(
    [](std::string& v) { return std::atof(v.c_str()) >= 0 ? std::string() : "must be 0 or more, got " + v; }, ">=0");
const CLI::Validator kFrequency(
    [](std::string& v) {
      return v == "-1" || std::atof(v.c_str()) > 0 ? std::string() : "must be -1 (at the end) or positive, got " + v;
    },
    "-1 or >0");

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel character-level LSTM language model"};
  int batchsize = 16, epoch = 5, unit = 128, embed = 32, lines = 0, seed = 0, frequency = -1;
  double lr = 0.003, gradclip = 5.0;
  bool gpu = false;
  std::string communicator = "pure_nccl", out = "result", resume, data = "/usr/share/common-licenses/GPL-3";
  app.add_option("-b,--batchsize", batchsize, "Number of lines in each mini-batch (per process)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--communicator", communicator,
                 "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_option("-e,--epoch", epoch, "Number of sweeps over the text")->capture_default_str()->check(kPositive);
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option("-r,--resume", resume,
                 "Resume from a snapshot, e.g. result/snapshot_iter_600 (each process loads its own file)");
  app.add_option("-f,--frequency", frequency, "Epochs between snapshots (positive; -1: at the end)")
      ->capture_default_str()->check(kFrequency);
  app.add_option("-u,--unit", unit, "Number of LSTM units")->capture_default_str()->check(kPositive);
  app.add_option("--embed", embed, "Size of the byte embeddings")->capture_default_str()->check(kPositive);
  app.add_option("--lr", lr, "Adam's step size")->capture_default_str()->check(kPositive);
  app.add_option("-c,--gradclip", gradclip, "Largest L2 norm of the gradients")
      ->capture_default_str()->check(kPositive);
  app.add_option("--seed", seed, "Seed of the initial weights and of the shuffling")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--data", data,
                 "Text file to learn, one example per non-empty line (every tenth line is held out for validation)")
      ->capture_default_str();
  app.add_option("--lines", lines, "Use only the first N non-empty lines (0: all)")
      ->capture_default_str()->check(kNonNegative);
  CLI11_PARSE(app, argc, argv);

  // Prepare the communicator: a GPU one with --gpu, "naive" on CPUs.          (multi-node)
  const bool cpu_communicator = communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(stderr, "Error: 'naive' communicator does not support GPU; use e.g. --communicator pure_nccl\n");
    return 1;
  }
  if (!gpu && !cpu_communicator) communicator = "naive";
  if (kusari::only_check_arguments("train_charlm")) return 0;
  auto comm = kusari::mn::create_communicator(communicator);
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(1);

  // Every process reads the (local) text and keeps its shard of the lines.      (multi-node)
  auto text = std::make_shared<LineDataset>(data, lines);
  auto train = kusari::mn::scatter_dataset(std::make_shared<StrideDataset>(text, 10, false), comm, 0, true, seed);
  auto test = kusari::mn::scatter_dataset(std::make_shared<StrideDataset>(text, 10, true), comm, 0, true, seed);
  kusari::mn::check_same_settings(comm,                                      // (multi-node)
                                  {{"--batchsize", std::to_string(batchsize)}, {"--epoch", std::to_string(epoch)},
                                   {"--unit", std::to_string(unit)}, {"--embed", std::to_string(embed)},
                                   {"--seed", std::to_string(seed)}, {"--frequency", std::to_string(frequency)},
                                   {"lines of the text", std::to_string(text->size())},
                                   {"--communicator", communicator}, {"--gpu", gpu ? "on" : "off"},
                                   {"--resume", resume.empty() ? "(none)" : "given"}},
                                  "train_charlm");
  if (comm->rank() == 0) {
    std::printf("==========================================\nNum process (COMM_WORLD): %d\n%sUsing %s communicator\n"
                "Num unit: %d\nNum Minibatch-size: %d\nNum epoch: %d\n"
                "%s: %lld lines, %lld for training and %lld for validation\n"
                "==========================================\n",
                comm->size(), gpu ? "Using GPUs\n" : "", communicator.c_str(), unit, batchsize, epoch, data.c_str(),
                static_cast<long long>(text->size()), static_cast<long long>(text->size() - (text->size() + 9) / 10),
                static_cast<long long>((text->size() + 9) / 10));
    std::fflush(stdout);
  }

  kusari::manual_seed(static_cast<uint64_t>(seed));
  auto model = std::make_shared<CharLM>(embed, unit);
  model->to_device(device);
  // Average the gradients over the processes before each update.               (multi-node)
  auto optimizer = kusari::mn::create_multi_node_optimizer(std::make_shared<kusari::optimizers::Adam>(lr), comm);
  optimizer->setup(model);
  optimizer->add_hook(std::make_shared<kusari::optimizers::GradientClipping>(gradclip));

  // A batch is its lines sorted by decreasing length, each its own array: no padding.
  kusari::training::Converter converter = [](const std::vector<kusari::Example>& batch, kusari::Device dev) {
    std::vector<Array> sorted;
    for (const kusari::Example& example : batch) sorted.push_back(example[0].to_device(dev));
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const Array& a, const Array& b) { return a.shape()[0] > b.shape()[0]; });
    return sorted;
  };
  auto train_iter = std::make_shared<kusari::SerialIterator>(train, batchsize, true, true, seed + comm->rank());
  auto test_iter = std::make_shared<kusari::SerialIterator>(test, batchsize, false, false);
  auto updater = std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer, device, converter);
  kusari::training::Trainer trainer(updater, kusari::training::interval(epoch, "epoch"), out);
  trainer.extend(
      kusari::mn::create_multi_node_evaluator(E::Evaluator(test_iter, model, converter, device), comm));
  // Snapshots: one file per process under mpiexec, each with its own iterator state. (multi-node)
  const int snapshot_every = frequency == -1 ? epoch : frequency;
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", kusari::training::interval(snapshot_every, "epoch"));
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",
                   kusari::training::interval(snapshot_every, "epoch"));
  }
  if (comm->rank() == 0) {
    // The perplexity of an epoch is exp of its mean loss per byte (Chainer's ptb example).
    auto log = std::make_shared<E::LogReport>();
    log->set_postprocess([](E::LogReport::Entry& entry) {
      for (const char* key : {"main", "validation/main"}) {
        const std::string loss = std::string(key) + "/loss";
        if (entry.count(loss)) entry[std::string(key) + "/perplexity"] = std::exp(entry[loss]);
      }
    });
    trainer.extend(log);
    trainer.extend(std::make_shared<E::PrintReport>(
        std::vector<std::string>{"epoch", "iteration", "main/loss", "main/perplexity", "validation/main/loss",
                                 "validation/main/perplexity", "elapsed_time"}));
    trainer.extend(std::make_shared<E::ProgressBar>());
  }
  if (!resume.empty()) kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
  trainer.run();
  return 0;
}
