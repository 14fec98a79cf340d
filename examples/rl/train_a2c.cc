// Advantage actor-critic (A2C) on CartPole, trained data-parallel: every process steps its own
// batch of environments, and the multi-node optimizer averages the policy gradients over the
// processes, so every process holds the same model (the synchronous A2C of Mnih et al. 2016 with
// the workers as MPI processes). The environment is written here in C++:
//
//   mpiexec -n 2 ./train_a2c                     # CPUs, "naive" communicator
//   ./train_a2c --envs 16 --steps 3000           # one process
//
// The lines that make the single-process program multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
using kusari::Array;
using kusari::Variable;

// The cart-pole of Barto, Sutton & Anderson (1983) with the constants, Euler integration, limits
// and 500-step cap of Gym's CartPole-v1. Reward 1 per step; done when the pole falls, the cart
// leaves the track or the cap is reached (then the environment starts a new episode).
class CartPole {
 public:
  static constexpr int kObs = 4, kActions = 2, kMaxSteps = 500;

  explicit CartPole(uint64_t seed) : rng_(seed) { reset(); }

  void reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (double& s : state_) s = u(rng_);
    steps_ = 0;
  }
  // Applies the action (0: push left, 1: push right); returns true when the episode ended.
  bool step(int action) {
    constexpr double gravity = 9.8, masscart = 1.0, masspole = 0.1, total_mass = masscart + masspole;
    constexpr double length = 0.5, polemass_length = masspole * length, force_mag = 10.0, tau = 0.02;
    constexpr double theta_limit = 12.0 * 2.0 * M_PI / 360.0, x_limit = 2.4;
    auto& [x, x_dot, theta, theta_dot] = state_;
    const double force = action == 1 ? force_mag : -force_mag;
    const double cos_t = std::cos(theta), sin_t = std::sin(theta);
    const double temp = (force + polemass_length * theta_dot * theta_dot * sin_t) / total_mass;
    const double theta_acc =
        (gravity * sin_t - cos_t * temp) / (length * (4.0 / 3.0 - masspole * cos_t * cos_t / total_mass));
    const double x_acc = temp - polemass_length * theta_acc * cos_t / total_mass;
    x += tau * x_dot;
    x_dot += tau * x_acc;
    theta += tau * theta_dot;
    theta_dot += tau * theta_acc;
    ++steps_;
    return std::abs(x) > x_limit || std::abs(theta) > theta_limit || steps_ >= kMaxSteps;
  }
  const std::array<double, 4>& state() const { return state_; }

 private:
  std::mt19937_64 rng_;
  std::array<double, 4> state_{};
  int steps_ = 0;
};

// Separate actor and critic MLPs: 4 -> hidden -> 2 action logits, 4 -> hidden -> 1 value.
class ActorCritic : public kusari::Chain {
 public:
  explicit ActorCritic(int64_t hidden) {
    pi1 = add_link("pi1", std::make_shared<L::Linear>(CartPole::kObs, hidden));
    pi2 = add_link("pi2", std::make_shared<L::Linear>(hidden, CartPole::kActions));
    v1 = add_link("v1", std::make_shared<L::Linear>(CartPole::kObs, hidden));
    v2 = add_link("v2", std::make_shared<L::Linear>(hidden, 1));
  }
  Variable logits(const Variable& obs) { return (*pi2)(F::tanh((*pi1)(obs))); }
  Variable value(const Variable& obs) { return F::reshape((*v2)(F::tanh((*v1)(obs))), {obs.shape()[0]}); }

 private:
  std::shared_ptr<L::Linear> pi1, pi2, v1, v2;
};

// The observations of all environments as a (envs, 4) float32 batch.
static Array observe(const std::vector<CartPole>& envs, kusari::Device device) {
  std::vector<float> obs;
  for (const CartPole& env : envs) obs.insert(obs.end(), env.state().begin(), env.state().end());
  return Array::from_vector(obs, kusari::Shape{static_cast<int64_t>(envs.size()), CartPole::kObs}, device);
}

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel A2C on CartPole"};
  int n_envs = 8, steps = 1500, n_step = 5, hidden = 64, seed = 0, log_interval = 50;
  double lr = 7e-3, gamma = 0.99, entropy_coef = 0.01, value_coef = 0.5;
  bool gpu = false;
  std::string communicator = "naive", out = "result";
  app.add_option("--communicator", communicator, "Type of communicator (naive or flat on CPUs)")
      ->capture_default_str()
      ->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("--envs", n_envs, "Environments stepped together by each process")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "Number of updates (each of --nstep steps of every environment)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--nstep", n_step, "Steps per rollout (n of the n-step returns)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-u,--unit", hidden, "Hidden units of the actor and of the critic")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam's step size")->capture_default_str();
  app.add_option("--seed", seed, "Random seed (process r seeds its environments with seed + r)")->capture_default_str();
  app.add_option("--log-interval", log_interval, "Updates between log entries")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-o,--out", out, "Directory to output the log")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto comm = kusari::mn::create_communicator(communicator);                  // (multi-node)
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(1);
  kusari::mn::check_same_settings(*comm,                                      // (multi-node)
                                  {{"--envs", std::to_string(n_envs)},
                                   {"--steps", std::to_string(steps)},
                                   {"--nstep", std::to_string(n_step)},
                                   {"--unit", std::to_string(hidden)},
                                   {"--seed", std::to_string(seed)},
                                   {"--communicator", communicator},
                                   {"--gpu", gpu ? "on" : "off"}},
                                  "train_a2c");
  kusari::manual_seed(seed);
  auto model = std::make_shared<ActorCritic>(hidden);
  model->to_device(device);
  // Average the gradients over the processes before each update.               (multi-node)
  auto optimizer = kusari::mn::create_multi_node_optimizer(std::make_shared<kusari::optimizers::Adam>(lr), comm);
  optimizer->setup(model);
  optimizer->add_hook(std::make_shared<kusari::optimizers::GradientClipping>(0.5));

  std::vector<CartPole> envs;
  for (int i = 0; i < n_envs; ++i) envs.emplace_back((static_cast<uint64_t>(seed + comm->rank()) << 20) + i);
  std::mt19937_64 rng(static_cast<uint64_t>(seed + comm->rank()) * 7919 + 1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> episode_return(n_envs, 0.0);
  std::deque<double> recent;  // returns of the last episodes of this process
  int64_t episodes = 0;

  if (comm->rank() == 0) {
    std::printf("Num process (COMM_WORLD): %d, %d environments each, %d-step returns\n", comm->size(), n_envs, n_step);
    std::printf("%-8s %-10s %-12s %-12s %s\n", "update", "episodes", "mean_return", "loss", "elapsed_time");
    std::filesystem::create_directories(out);
  }
  std::string log = "[";
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0.0;
  const int64_t E = n_envs, T = n_step;
  for (int update = 1; update <= steps; ++update) {
    // Rollout: T steps of every environment with the current policy, without a graph.
    std::vector<Array> obs_t;
    std::vector<float> actions(T * E * CartPole::kActions, 0.0f), rewards(T * E), not_done(T * E);
    {
      kusari::NoBackpropMode no_graph;
      for (int64_t t = 0; t < T; ++t) {
        obs_t.push_back(observe(envs, device));
        std::vector<float> probs = F::softmax(model->logits(obs_t.back())).array().to_vector<float>();
        for (int64_t e = 0; e < E; ++e) {
          const int a = uniform(rng) < probs[e * 2] ? 0 : 1;
          actions[(t * E + e) * 2 + a] = 1.0f;
          const bool done = envs[e].step(a);
          rewards[t * E + e] = 1.0f;
          not_done[t * E + e] = done ? 0.0f : 1.0f;
          episode_return[e] += 1.0;
          if (done) {
            recent.push_back(episode_return[e]);
            if (recent.size() > 20) recent.pop_front();
            episode_return[e] = 0.0;
            ++episodes;
            envs[e].reset();
          }
        }
      }
    }
    // n-step returns R_t = r_t + gamma R_{t+1}, bootstrapped from the critic's value of the last
    // observation and cut where an episode ended.
    std::vector<float> returns(T * E);
    {
      kusari::NoBackpropMode no_graph;
      std::vector<float> next = model->value(observe(envs, device)).array().to_vector<float>();
      for (int64_t t = T - 1; t >= 0; --t) {
        for (int64_t e = 0; e < E; ++e) {
          next[e] = rewards[t * E + e] + static_cast<float>(gamma) * next[e] * not_done[t * E + e];
          returns[t * E + e] = next[e];
        }
      }
    }
    // The loss on the whole rollout as one (T E, 4) batch: policy gradient with the advantage
    // R - V (V held constant), the critic's squared error, and an entropy bonus.
    Variable obs = F::concat(std::vector<Variable>(obs_t.begin(), obs_t.end()), 0);
    Array ret = Array::from_vector(returns, kusari::Shape{T * E}, device);
    Array onehot = Array::from_vector(actions, kusari::Shape{T * E, CartPole::kActions}, device);
    optimizer->update([&] {
      Variable logp = F::log_softmax(model->logits(obs));
      Variable value = model->value(obs);
      Variable advantage = Variable(ret) - value.detached();
      Variable logp_action = F::sum(logp * Variable(onehot), {1});
      Variable entropy = -F::sum(F::exp(logp) * logp, {1});
      Variable loss = -F::mean(logp_action * advantage) +
                      value_coef * F::mean(F::square(value - Variable(ret))) - entropy_coef * F::mean(entropy);
      loss_sum += loss.array().item<double>();
      return loss;
    });

    if (update % log_interval == 0 || update == steps) {
      // The mean return of the last (up to 20) episodes of every process.          (multi-node)
      std::vector<double> totals = comm->allreduce_obj(
          std::vector<double>{std::accumulate(recent.begin(), recent.end(), 0.0), static_cast<double>(recent.size()),
                              static_cast<double>(episodes), loss_sum / log_interval});
      loss_sum = 0.0;
      if (comm->rank() == 0) {
        const double mean_return = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double loss = totals[3] / comm->size();
        std::printf("%-8d %-10lld %-12.2f %-12.4f %.2f\n", update, static_cast<long long>(totals[2]), mean_return,
                    loss, elapsed);
        std::fflush(stdout);
        char entry[256];
        std::snprintf(entry, sizeof entry,
                      "%s\n  {\"update\": %d, \"episodes\": %lld, \"mean_return\": %.4f, \"loss\": %.6f, "
                      "\"elapsed_time\": %.4f}",
                      log.size() > 1 ? "," : "", update, static_cast<long long>(totals[2]), mean_return, loss,
                      elapsed);
        log += entry;
      }
    }
  }
  // Every process must end with the same weights: compare a checksum of them.      (multi-node)
  double checksum = 0.0;
  for (const kusari::Parameter& p : model->params()) {
    for (float v : p.array().to_vector<float>()) checksum += static_cast<double>(v);
  }
  char checksum_text[64];
  std::snprintf(checksum_text, sizeof checksum_text, "%.9g", checksum);
  kusari::mn::check_same_settings(*comm, {{"sum of the trained weights", checksum_text}}, "train_a2c");
  if (comm->rank() == 0) {
    std::FILE* file = std::fopen((std::filesystem::path(out) / "log").c_str(), "w");
    std::fprintf(file, "%s\n]\n", log.c_str());
    std::fclose(file);
  }
  return 0;
}
