// The names a snippet of docs/*.md or README.md may use without defining them (docs/README.md,
// "Code snippets"). The snippets are compiled, never linked or run, so these are declarations
// only. A snippet that defines one of these names itself simply shadows it.
#pragma once

#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace doc_snippet_context {

/// The MLP of examples/mnist/train_mnist.cc: n_units -> n_units -> n_out with ReLU.
class MLP : public kusari::Chain {
 public:
  MLP(int64_t n_units, int64_t n_out);
  kusari::Variable forward(const kusari::Variable& x) override;
};

using kusari::Variable;
using kusari::links::Classifier;
namespace F = kusari::functions;
namespace L = kusari::links;
namespace mn = kusari::mn;

extern kusari::Device device;                                   // where the model lives
extern std::shared_ptr<kusari::links::Classifier> model;        // Classifier(MLP(1000, 10))
extern std::shared_ptr<kusari::Optimizer> optimizer;            // set up with the model
extern std::shared_ptr<kusari::Dataset> train, test, train_all; // datasets (train_all: unscattered)
extern std::shared_ptr<kusari::SerialIterator> train_iter, test_iter;
extern std::shared_ptr<kusari::training::StandardUpdater> updater;
extern kusari::training::Trainer& trainer;
extern std::shared_ptr<kusari::mn::Communicator> comm;
extern kusari::Array x, t;                                      // a batch: inputs and labels
extern kusari::Variable loss;                                   // a loss to backpropagate

}  // namespace doc_snippet_context
