// Advantage actor-critic (A2C) on CartPole, trained data-parallel: every process steps its own
// batch of environments, and the multi-node optimizer averages the policy gradients over the
// processes (the synchronous A2C of Mnih et al. 2016 with the workers as MPI processes). The
// environment is written here in C++; a Trainer's updater runs one rollout and one update per
// iteration. `mpiexec -n 2 ./train_a2c` on CPUs, `./train_a2c --envs 16` on one process. The
// lines that make the single-process program multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "cartpole.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
namespace E = kusari::training::extensions;
using kusari::Array;
using kusari::Variable;

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

// One iteration: n_step steps of every environment with the current policy, then one update on
// the whole rollout (ChainerRL's A2C.update). There is no dataset, so no epoch ever ends; the
// training length counts iterations (updates). A snapshot keeps the environments and the
// generator's position, so a resumed run goes on as an uninterrupted one would.
class A2CUpdater : public kusari::training::Updater {
 public:
  static constexpr double kGamma = 0.99, kValueCoef = 0.5, kEntropyCoef = 0.01;
  A2CUpdater(std::shared_ptr<ActorCritic> model, std::shared_ptr<kusari::Optimizer> optimizer, int64_t envs,
             int64_t n_step, uint64_t seed, kusari::Device device)
      : model_(std::move(model)), opt_(std::move(optimizer)), n_step_(n_step), rng_(seed), device_(device),
        envs_(envs) {
    for (CartPole& env : envs_) env.reset(rng_);
  }

  void update() override {
    const int64_t E = static_cast<int64_t>(envs_.size()), T = n_step_;
    std::vector<Array> obs_t;
    std::vector<float> onehot(T * E * CartPole::kActions, 0.0f), not_done(T * E), returns(T * E);
    {
      kusari::NoBackpropMode no_graph;  // the rollout needs no graph
      for (int64_t t = 0; t < T; ++t) {
        obs_t.push_back(observe());
        std::vector<float> probs = F::softmax(model_->logits(obs_t.back())).array().to_vector<float>();
        for (int64_t e = 0; e < E; ++e) {
          const int a = uniform(rng_) < probs[e * 2] ? 0 : 1;
          onehot[(t * E + e) * 2 + a] = 1.0f;
          const bool done = envs_[e].step(a);
          not_done[t * E + e] = done ? 0.0f : 1.0f;
          envs_[e].ret += 1.0;  // reward 1 per step
          if (done) {
            recent_.push_back(envs_[e].ret);
            if (recent_.size() > 20) recent_.erase(recent_.begin());
            ++episodes_;
            envs_[e].reset(rng_);
          }
        }
      }
      // n-step returns R_t = 1 + gamma R_{t+1}, bootstrapped from the critic's value of the last
      // observation and cut where an episode ended.
      std::vector<float> next = model_->value(observe()).array().to_vector<float>();
      for (int64_t t = T - 1; t >= 0; --t) {
        for (int64_t e = 0; e < E; ++e) {
          next[e] = 1.0f + static_cast<float>(kGamma) * next[e] * not_done[t * E + e];
          returns[t * E + e] = next[e];
        }
      }
    }
    // The loss on the whole rollout as one (T E, 4) batch: policy gradient with the advantage
    // R - V (V held constant), the critic's squared error, and an entropy bonus.
    Variable obs = F::concat(std::vector<Variable>(obs_t.begin(), obs_t.end()), 0);
    Array ret = Array::from_vector(returns, kusari::Shape{T * E}, device_);
    Array actions = Array::from_vector(onehot, kusari::Shape{T * E, CartPole::kActions}, device_);
    Array loss_value;
    opt_->update([&] {
      Variable logp = F::log_softmax(model_->logits(obs));
      Variable value = model_->value(obs);
      Variable advantage = Variable(ret) - value.detached();
      Variable entropy = -F::sum(F::exp(logp) * logp, {1});
      Variable loss = -F::mean(F::sum(logp * Variable(actions), {1}) * advantage) +
                      kValueCoef * F::mean(F::square(value - Variable(ret))) - kEntropyCoef * F::mean(entropy);
      loss_value = loss.array();
      return loss;
    });
    kusari::Observation observation;
    observation.emplace("loss", loss_value);
    kusari::report(observation, static_cast<const kusari::Link*>(model_.get()));
    ++iteration_;
  }
  // The sum and number of this process's last (up to 20) episode returns, and its episodes.
  std::vector<double> stats() const {
    return {std::accumulate(recent_.begin(), recent_.end(), 0.0), static_cast<double>(recent_.size()),
            static_cast<double>(episodes_)};
  }

  int64_t iteration() const override { return iteration_; }
  int64_t epoch() const override { return 0; }
  double epoch_detail() const override { return 0.0; }
  double previous_epoch_detail() const override { return 0.0; }
  bool is_new_epoch() const override { return false; }
  // No dataset is swept: the progress bar shows iterations only.
  bool has_epochs() const override { return false; }
  kusari::Optimizer& optimizer(const std::string& name) override {
    KUSARI_CHECK(name == "main", ValueError, "A2CUpdater::optimizer: no optimizer '", name, "' (only 'main')");
    return *opt_;
  }
  kusari::Iterator& iterator(const std::string& name) override {
    KUSARI_THROW(ValueError, "A2CUpdater::iterator: no iterator '", name, "': the updater steps its environments");
  }
  void serialize(kusari::Serializer& s) override {
    opt_->serialize(*s.child("optimizer:main"));
    model_->serialize(*s.child("model:main"));
    s.count("iteration", iteration_);
    s.count("episodes", episodes_);
    auto offset = static_cast<int64_t>(rng_.offset());
    s("generator_offset", offset);
    rng_.set_offset(static_cast<uint64_t>(offset));
    // Each environment as (x, x_dot, theta, theta_dot, steps, return so far); the last returns.
    std::vector<double> flat;
    for (const CartPole& env : envs_) {
      flat.insert(flat.end(), env.state.begin(), env.state.end());
      flat.insert(flat.end(), {static_cast<double>(env.steps), env.ret});
    }
    Array envs = Array::from_vector(flat, kusari::Shape{static_cast<int64_t>(envs_.size()), 6}, kusari::Device::cpu());
    Array recent;  // loaded with the stored length
    if (!s.is_loading()) recent = Array::from_vector(recent_, kusari::Shape{static_cast<int64_t>(recent_.size())});
    s("environments", envs);
    s("recent_returns", recent);
    if (!s.is_loading()) return;
    flat = envs.to_vector<double>();
    for (size_t e = 0; e < envs_.size(); ++e) {
      std::copy(flat.begin() + 6 * e, flat.begin() + 6 * e + 4, envs_[e].state.begin());
      envs_[e].steps = static_cast<int>(flat[6 * e + 4]);
      envs_[e].ret = flat[6 * e + 5];
    }
    recent_ = recent.to_vector<double>();
  }

 private:
  // The observations of all environments as a (envs, 4) float32 batch.
  Array observe() const {
    std::vector<float> obs;
    for (const CartPole& env : envs_) obs.insert(obs.end(), env.state.begin(), env.state.end());
    return Array::from_vector(obs, kusari::Shape{static_cast<int64_t>(envs_.size()), CartPole::kObs}, device_);
  }

  std::shared_ptr<ActorCritic> model_;
  std::shared_ptr<kusari::Optimizer> opt_;
  int64_t n_step_;
  kusari::Generator rng_;
  kusari::Device device_;
  std::vector<CartPole> envs_;
  std::vector<double> recent_;  // the returns of this process's last (up to 20) episodes
  int64_t iteration_ = 0, episodes_ = 0;
};

// Flag checks whose messages name the value and what is expected.
const CLI::Validator kPositive(
    [](std::string& v) { return std::atof(v.c_str()) > 0 ? std::string() : "must be positive, got " + v; }, "POSITIVE");
const CLI::Validator kSnapshotInterval(
    [](std::string& v) {
      return v == "-1" || std::atof(v.c_str()) > 0 ? std::string() : "must be -1 (at the end) or positive, got " + v;
    },
    "-1 or >0");

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel A2C on CartPole"};
  int n_envs = 8, steps = 1500, n_step = 5, hidden = 64, seed = 0, log_interval = 50, snapshot_interval = -1;
  double lr = 7e-3;
  bool gpu = false;
  std::string communicator = "pure_nccl", out = "result", resume;
  app.add_option("--communicator", communicator,
                 "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option("-r,--resume", resume,
                 "Resume from a snapshot, e.g. result/snapshot_iter_1500 (each process loads its own file)");
  app.add_option("--envs", n_envs, "Environments stepped together by each process")
      ->capture_default_str()->check(kPositive);
  app.add_option("--steps", steps, "Number of updates (each of --nstep steps of every environment)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--nstep", n_step, "Steps per rollout (n of the n-step returns)")
      ->capture_default_str()->check(kPositive);
  app.add_option("-u,--unit", hidden, "Hidden units of the actor and of the critic")
      ->capture_default_str()->check(kPositive);
  app.add_option("--lr", lr, "Adam's step size")->capture_default_str()->check(kPositive);
  app.add_option("--seed", seed, "Random seed of the weights and of each process's environments and actions")
      ->capture_default_str()->check(CLI::Range(0, 1 << 30));
  app.add_option("--log-interval", log_interval, "Updates between log entries")
      ->capture_default_str()->check(kPositive);
  app.add_option("--snapshot-interval", snapshot_interval, "Updates between snapshots (positive; -1: at the end)")
      ->capture_default_str()->check(kSnapshotInterval);
  CLI11_PARSE(app, argc, argv);

  // Prepare the communicator: a GPU one with --gpu, "naive" on CPUs.          (multi-node)
  const bool cpu_communicator = communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(stderr, "Error: 'naive' communicator does not support GPU; use e.g. --communicator pure_nccl\n");
    return 1;
  }
  if (!gpu && !cpu_communicator) communicator = "naive";
  if (kusari::only_check_arguments("train_a2c")) return 0;
  auto comm = kusari::mn::create_communicator(communicator);
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  kusari::set_num_threads(1);
  kusari::set_blas_num_threads(1);
  kusari::mn::check_same_settings(comm,                                      // (multi-node)
                                  {{"--envs", std::to_string(n_envs)}, {"--steps", std::to_string(steps)},
                                   {"--nstep", std::to_string(n_step)}, {"--unit", std::to_string(hidden)},
                                   {"--seed", std::to_string(seed)}, {"--log-interval", std::to_string(log_interval)},
                                   {"--snapshot-interval", std::to_string(snapshot_interval)},
                                   {"--communicator", communicator}, {"--gpu", gpu ? "on" : "off"},
                                   {"--resume", resume.empty() ? "(none)" : "given"}},
                                  "train_a2c");
  if (comm->rank() == 0) {
    std::printf("==========================================\nNum process (COMM_WORLD): %d\n%sUsing %s communicator\n"
                "Num environments: %d per process, %d-step returns\nNum updates: %d\n"
                "==========================================\n",
                comm->size(), gpu ? "Using GPUs\n" : "", communicator.c_str(), n_envs, n_step, steps);
    std::fflush(stdout);
  }

  kusari::manual_seed(static_cast<uint64_t>(seed));
  auto model = std::make_shared<ActorCritic>(hidden);
  model->to_device(device);
  // Average the gradients over the processes before each update.               (multi-node)
  auto optimizer = kusari::mn::create_multi_node_optimizer(std::make_shared<kusari::optimizers::Adam>(lr), comm);
  optimizer->setup(model);
  optimizer->add_hook(std::make_shared<kusari::optimizers::GradientClipping>(0.5));
  // Each process steps its own environments.                                   (multi-node)
  auto updater = std::make_shared<A2CUpdater>(model, optimizer, n_envs, n_step,
                                              static_cast<uint64_t>(seed) * 1000003u + 1 + comm->rank(), device);
  kusari::training::Trainer trainer(updater, kusari::training::interval(steps, "iteration"), out);
  auto every_log = [&] { return kusari::training::interval(log_interval, "iteration"); };  // one per extension
  // The mean return of the last (up to 20) episodes of every process, and their episodes. (multi-node)
  trainer.extend(kusari::training::make_extension(
      [updater, comm](kusari::training::Trainer&) {
        std::vector<double> t = comm->allreduce_obj(updater->stats());
        kusari::report_scalar("mean_return", t[1] > 0 ? t[0] / t[1] : 0.0);
        kusari::report_scalar("episodes", t[2]);
      },
      "episode_returns", every_log(), kusari::training::kPriorityWriter));
  const int snapshot_every = snapshot_interval == -1 ? steps : snapshot_interval;
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", kusari::training::interval(snapshot_every, "iteration"));
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",  // (multi-node)
                   kusari::training::interval(snapshot_every, "iteration"));
  }
  if (comm->rank() == 0) {
    trainer.extend(std::make_shared<E::LogReport>(std::nullopt, every_log()));
    trainer.extend(std::make_shared<E::PrintReport>(
        std::vector<std::string>{"iteration", "episodes", "mean_return", "main/loss", "elapsed_time"}));
    trainer.extend(std::make_shared<E::ProgressBar>());
  }
  if (!resume.empty()) kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
  trainer.run();
  // Every process must end with the same weights: compare a checksum of them.      (multi-node)
  double checksum = 0.0;
  for (const kusari::Parameter& p : model->params()) {
    checksum += kusari::sum(p.array().astype(kusari::float64)).item<double>();
  }
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", checksum);
  kusari::mn::check_same_settings(comm, {{"sum of the trained weights", text}}, "train_a2c");
  return 0;
}
