// What the two model-parallel MNIST examples share: their flags, the two halves of the MLP, a test
// set evaluation that runs on both halves at once, and a report printed once per epoch.
// Read train_mnist_model_parallel.cc first; this file only holds the plumbing.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace example {

namespace F = kusari::functions;
using kusari::Variable;

/// The command-line flags (Chainer's train_mnist names and defaults).
struct Args {
  int64_t batchsize = 100;
  int64_t epoch = 20;
  int64_t unit = 1000;
  std::string out = "result";
};

/// Parses the flags with CLI11 ("--epoch 5", "--epoch=5" or "-e 5"). Returns the exit code the
/// program should end with after --help or a bad flag, whose text (CLI11's help or error) only
/// the process with `print` set writes; std::nullopt when the program goes on.
inline std::optional<int> parse_args(int argc, char** argv, const std::string& description,
                                     bool print, Args& args) {
  CLI::App app{description};
  app.add_option("-b,--batchsize", args.batchsize, "Number of images in each mini-batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("-e,--epoch", args.epoch, "Number of sweeps over the dataset to train")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("-u,--unit", args.unit, "Number of units of each hidden layer")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("-o,--out", args.out, "Directory to output the result")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return print ? app.exit(e) : e.get_exit_code();
  }
  return std::nullopt;
}

/// Ends every process with the same error, naming each flag and its values, when the processes
/// were started with different flags: the halves would otherwise exchange activations of other
/// sizes, or one would stop while the other waits (Note [Same settings]).
inline void check_same_args(kusari::mn::Communicator& comm, const Args& args, const char* program) {
  kusari::mn::check_same_settings(comm,
                                  {{"--batchsize", std::to_string(args.batchsize)},
                                   {"--epoch", std::to_string(args.epoch)},
                                   {"--unit", std::to_string(args.unit)}},
                                  program);
}

/// The first half of the 784-unit-unit-10 MLP: Linear(784, unit) -> ReLU.
inline std::shared_ptr<kusari::Sequential> first_half(int64_t unit) {
  auto half = std::make_shared<kusari::Sequential>();
  half->add(std::make_shared<kusari::links::Linear>(784, unit)).add([](const Variable& h) {
    return F::relu(h);
  });
  return half;
}

/// The second half: Linear(unit, unit) -> ReLU -> Linear(unit, 10).
inline std::shared_ptr<kusari::Sequential> second_half(int64_t unit) {
  auto half = std::make_shared<kusari::Sequential>();
  half->add(std::make_shared<kusari::links::Linear>(unit, unit))
      .add([](const Variable& h) { return F::relu(h); })
      .add(std::make_shared<kusari::links::Linear>(unit, 10));
  return half;
}

/// Runs the test set through the split model once per epoch. Both ranks of the model-parallel
/// pair run it at the same iteration; the rank with the output (has_output) puts
/// validation/main/loss and validation/main/accuracy into the trainer's observation.
inline std::shared_ptr<kusari::training::Extension> test_evaluator(
    std::shared_ptr<kusari::Dataset> test, int64_t batchsize,
    std::shared_ptr<kusari::mn::MultiNodeChainList> model, bool has_output) {
  auto fn = [=](kusari::training::Trainer& trainer) {
    kusari::NoBackpropMode no_backprop;  // neither rank records a graph, so no backward is owed
    kusari::SerialIterator it(test, batchsize, /*repeat=*/false, /*shuffle=*/false);
    double loss = 0, accuracy = 0;
    int64_t n = 0;
    for (auto batch = it.next(); !batch.empty(); batch = it.next()) {
      std::vector<kusari::Array> xt = kusari::concat_examples(batch);
      Variable y = model->forward(xt[0]);  // the second half ignores x: it receives from the first
      if (has_output) {
        const double b = static_cast<double>(batch.size());
        loss += F::softmax_cross_entropy(y, xt[1]).data().item<double>() * b;
        accuracy += F::accuracy(y, xt[1]).data().item<double>() * b;
      }
      n += static_cast<int64_t>(batch.size());
    }
    if (has_output) {
      trainer.observation()["validation/main/loss"] =
          kusari::Array::scalar(loss / n, kusari::float64);
      trainer.observation()["validation/main/accuracy"] =
          kusari::Array::scalar(accuracy / n, kusari::float64);
    }
  };
  return kusari::training::make_extension(fn, "test_evaluator",
                                          kusari::training::interval(1, "epoch"),
                                          kusari::training::kPriorityWriter);
}

/// Prints one line per epoch: the means of main/loss and main/accuracy over the epoch, the
/// validation values and the elapsed time (what Chainer's LogReport + PrintReport show).
class EpochReport : public kusari::training::Extension {
 public:
  void initialize(kusari::training::Trainer&) override {
    std::printf("%-6s %-12s %-14s %-22s %-26s %s\n", "epoch", "main/loss", "main/accuracy",
                "validation/main/loss", "validation/main/accuracy", "elapsed_time");
  }
  void operator()(kusari::training::Trainer& trainer) override {
    auto& obs = trainer.observation();
    loss_ += obs.at("main/loss").item<double>();
    accuracy_ += obs.at("main/accuracy").item<double>();
    ++count_;
    if (!trainer.updater().is_new_epoch()) return;
    auto value = [&](const char* key) { return obs.count(key) ? obs.at(key).item<double>() : 0.0; };
    std::printf("%-6lld %-12.6f %-14.6f %-22.6f %-26.6f %.2f\n",
                static_cast<long long>(trainer.updater().epoch()), loss_ / count_,
                accuracy_ / count_, value("validation/main/loss"),
                value("validation/main/accuracy"), trainer.elapsed_time());
    std::fflush(stdout);
    loss_ = accuracy_ = 0;
    count_ = 0;
  }
  std::string default_name() const override { return "EpochReport"; }
  std::shared_ptr<kusari::training::Trigger> default_trigger() const override {
    return kusari::training::interval(1, "iteration");
  }

 private:
  double loss_ = 0, accuracy_ = 0;
  int64_t count_ = 0;
};

}  // namespace example
