// Learns XOR with a Classifier and Adam on the CPU, then checks the predictions; exits non-zero
// when it did not learn. Also reports what the install says about GPUs on this machine.
#include <cstdio>
#include <memory>

#include <kusari/kusari.h>

namespace F = kusari::functions;
namespace L = kusari::links;

int main() {
  kusari::manual_seed(0);
  kusari::Array x = kusari::Array::from({0, 0, 0, 1, 1, 0, 1, 1}, kusari::Shape{4, 2});
  kusari::Array t = kusari::Array::from_vector(std::vector<int32_t>{0, 1, 1, 0});
  auto mlp = std::make_shared<kusari::Sequential>();
  mlp->add(std::make_shared<L::Linear>(2, 16));
  mlp->add([](const kusari::Variable& h) { return F::relu(h); });
  mlp->add(std::make_shared<L::Linear>(16, 2));
  auto model = std::make_shared<L::Classifier>(mlp);
  kusari::optimizers::Adam adam(0.05);
  adam.setup(model);
  double loss = 0;
  for (int step = 0; step < 300; ++step) {
    model->cleargrads();
    kusari::Variable l = (*model)(kusari::Variable(x), t);
    l.backward();
    adam.update();
    loss = l.data().item<double>();
  }
  kusari::Array pred = kusari::argmax((*mlp)(kusari::Variable(x)).data(), 1);
  const std::vector<int64_t> p = pred.to_vector<int64_t>();
  std::printf("kusari %s: loss %.4f, predictions %lld %lld %lld %lld, GPUs visible: %d\n", KUSARI_VERSION,
              loss, (long long)p[0], (long long)p[1], (long long)p[2], (long long)p[3],
              kusari::cuda_device_count());
  const bool learnt = p == std::vector<int64_t>{0, 1, 1, 0};
  if (!learnt) std::printf("xor_cpu: FAILED to learn XOR\n");
  return learnt ? 0 : 1;
}
