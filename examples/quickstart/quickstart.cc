// The smallest kusari program: a two-layer network learns XOR with plain gradient descent.
// It shows define-by-run autograd: the model is ordinary code, the graph is built as it runs.
#include <cstdio>

#include "kusari/kusari.h"

namespace F = kusari::functions;
using kusari::Array;
using kusari::Variable;

int main() {
  kusari::manual_seed(0);
  // Inputs and labels of XOR.
  Array x = Array::from({0, 0, 0, 1, 1, 0, 1, 1}, kusari::Shape{4, 2});
  Array t = Array::from_vector(std::vector<int32_t>{0, 1, 1, 0});
  // Parameters of a 2-16-2 network.
  kusari::Parameter W1(Array::normal({16, 2}, 0.0, 0.7)), b1(Array::zeros({16}));
  kusari::Parameter W2(Array::normal({2, 16}, 0.0, 0.25)), b2(Array::zeros({2}));
  const double lr = 0.5;
  for (int step = 0; step <= 300; ++step) {
    Variable h = F::relu(F::linear(x, W1, b1));
    Variable y = F::linear(h, W2, b2);
    Variable loss = F::softmax_cross_entropy(y, t);
    for (kusari::Parameter* p : {&W1, &b1, &W2, &b2}) p->cleargrad();
    loss.backward();
    for (kusari::Parameter* p : {&W1, &b1, &W2, &b2}) p->set_data(p->data() - p->grad() * lr);
    if (step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, loss.data().item<double>());
  }
  Array pred = kusari::argmax(F::linear(F::relu(F::linear(x, W1, b1)), W2, b2).data(), 1);
  std::printf("predictions for (0,0) (0,1) (1,0) (1,1): ");
  for (int64_t p : pred.to_vector<int64_t>()) std::printf("%lld ", static_cast<long long>(p));
  std::printf("(expected 0 1 1 0)\n");
  return 0;
}
