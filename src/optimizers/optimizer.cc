#include "kusari/optimizers/optimizer.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <sstream>

#include "kusari/core/routines.h"
#include "kusari/functions/math.h"
#include "optimizers/shard_layout_key.h"

namespace kusari {

Array& ParamState::get(const std::string& name) {
  for (auto& [n, a] : arrays) {
    if (n == name) return a;
  }
  KUSARI_THROW(ValueError, "optimizer state of ", path, ": no array named '", name, "'");
}

Array* ParamState::find(const std::string& name) {
  for (auto& [n, a] : arrays) {
    if (n == name) return &a;
  }
  return nullptr;
}

void ParamState::add(const std::string& name, Array value) {
  if (!value.defined()) value = Array::zeros_like(param.data());
  for (auto& [n, a] : arrays) {
    if (n == name) {
      a = std::move(value);
      return;
    }
  }
  arrays.emplace_back(name, std::move(value));
}

void Optimizer::setup(std::shared_ptr<Link> target) {
  KUSARI_CHECK(target, ValueError, type_name(), "::setup: the target link is null");
  target_ = std::move(target);
  settle_loss_scale();  // (a step of the previous target)
  states_.clear();
  pending_.clear();
  t_ = 0;
  epoch_ = 0;
}

void Optimizer::retarget(std::shared_ptr<Link> target) {
  KUSARI_CHECK(target, ValueError, type_name(), "::retarget: the target link is null");
  settle_loss_scale();
  target_ = std::move(target);
  states_.clear();
  pending_.clear();
}

std::vector<ParamState>& Optimizer::param_states() {
  KUSARI_CHECK(target_, ValueError, type_name(), ": call setup(link) before using the optimizer");
  settle_loss_scale();  // (its list of stepped states indexes states_ as it is)
  auto named = target_->namedparams(false);
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  bool same = named.size() == states_.size();
  for (size_t i = 0; same && i < named.size(); ++i) {
    same = named[i].first == states_[i].path && named[i].second.is(states_[i].param);
  }
  if (!same) {
    // Keep the state of parameters that are still there; add the new ones.
    std::vector<ParamState> next;
    next.reserve(named.size());
    for (auto& [path, p] : named) {
      auto it = std::find_if(states_.begin(), states_.end(),
                             [&](const ParamState& s) { return s.path == path && s.param.is(p); });
      if (it != states_.end()) {
        next.push_back(std::move(*it));
      } else {
        ParamState s;
        s.path = path;
        s.param = p;
        adopt_pending(s);
        next.push_back(std::move(s));
      }
    }
    states_ = std::move(next);
  }
  return states_;
}

// Note [Loading lazy states]
// The updater loads "optimizer:main" before "model:main" (Chainer's order), so when a model has
// lazily sized parameters (Linear(out) without in_size) the optimizer's state is read while those
// parameters have no data yet. serialize() then learns the state's names from init_state() on a
// one-element stand-in, reads the arrays with the shapes stored in the file and keeps them in
// pending_; param_states() hands them to the parameter once it has data (after the model is
// loaded or after the first forward), on the parameter's device and in the dtype its steps are
// computed in (float32 for a 16-bit parameter under use_fp32_update, whose float32 master copy
// is read too when the file has one).
void Optimizer::adopt_pending(ParamState& s) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const ParamState& q) {
    return q.path == s.path && q.param.is(s.param);
  });
  if (it == pending_.end()) return;
  const Array& data = s.param.data();
  const Dtype dtype = uses_master(s) ? Dtype::kFloat32 : data.dtype();
  for (auto& [name, a] : it->arrays) {
    KUSARI_CHECK(a.shape() == data.shape(), ShapeError, type_name(), ": the loaded state '", name,
                 "' of ", s.path, " has shape ", a.shape(), " but the parameter has shape ",
                 data.shape());
    a = a.to_device(data.device()).astype(dtype).contiguous();
  }
  s.arrays = std::move(it->arrays);
  s.t = it->t;
  s.initialized = true;
  pending_.erase(it);
}

bool Optimizer::uses_master(const ParamState& s) const {
  return fp32_update_ && is_half_precision(s.param.dtype());
}

void Optimizer::init_state_to_load(ParamState& s) {
  // The arrays are made like the ones the steps run on: float32 for a 16-bit parameter under
  // use_fp32_update (Note [Float32 master weights]).
  Parameter real = s.param;
  if (uses_master(s)) s.param = Parameter(Array::zeros(real.shape(), Dtype::kFloat32, real.device()));
  init_state(s);
  s.initialized = true;
  s.param = real;
}

void Optimizer::call_hooks(OptimizerHook::Timing timing) {
  for (auto& [name, hook] : hooks_) {
    if (hook->timing() == timing) (*hook)(*this);
  }
}

void Optimizer::update_one(ParamState& s) {
  std::optional<UpdateStep> step = update_step(s);
  KUSARI_CHECK(step.has_value(), NotImplementedError, type_name(),
               ": the optimizer defines neither update_one nor update_step, so it cannot step ",
               s.path);
  Array p = s.param.data();  // a handle to the parameter's memory
  update_parameter(step->rule, p, s.param.grad(), step->state, step->hyper, skip_flag());
}

// Note [Grouped optimizer updates]
// With use_multi_tensor_update (the default) update() asks each parameter for its step
// (update_step) instead of applying it (update_one), in the same order and at the same point of
// the step (after its state is made and its t incremented), then steps the collected parameters
// in groups, one kusari::update_parameters call per group (Note [Multi-tensor updates]). A group
// is the parameters whose step has the same rule, the same hyperparameter values (so, for Adam,
// the same step count t), the same number of states, dtype and device; groups are formed in
// the order of their first parameter. Parameters stepped through float32 master copies are in
// the float32 group and rounded back to their dtype after the groups ran. Each element gets the
// same arithmetic as in update_parameter, so the parameters and states are the same bits as
// with use_multi_tensor_update(false), which steps each parameter by update_one.
//
// The hooks do not prevent grouping: kPre hooks run on all gradients before any step and kPost
// hooks after all of them (Note [Optimizer step order]), so no hook sees a parameter between
// the step of one parameter and the next. An optimizer whose update_step returns nullopt (a
// custom one computing its step with array routines) is stepped per parameter as before.
namespace {

// Hyperparameter lists equal bit for bit (a NaN learning rate groups with itself).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint64_t>(a[i]) != std::bit_cast<uint64_t>(b[i])) return false;
  }
  return true;
}

}  // namespace

void Optimizer::run_grouped_steps(std::vector<GroupedStep>& steps) {
  std::vector<bool> done(steps.size(), false);
  for (size_t first = 0; first < steps.size(); ++first) {
    if (done[first]) continue;
    const GroupedStep& a = steps[first];
    std::vector<Array*> params;
    std::vector<Array> grads;
    std::vector<std::vector<Array*>> state;
    for (size_t j = first; j < steps.size(); ++j) {
      GroupedStep& b = steps[j];
      if (done[j] || b.step.rule != a.step.rule || !same_bits(b.step.hyper, a.step.hyper) ||
          b.step.state.size() != a.step.state.size() || b.param.dtype() != a.param.dtype() ||
          b.param.device() != a.param.device()) {
        continue;
      }
      done[j] = true;
      params.push_back(&b.param);
      grads.push_back(b.grad);
      state.push_back(b.step.state);
    }
    update_parameters(a.step.rule, params, grads, state, a.step.hyper, skip_flag());
    ++last_update_calls_;
  }
}

void Optimizer::update() {
  std::vector<ParamState>& states = param_states();  // (settles the previous step's verdict)
  last_update_calls_ = 0;
  // Undo a loss scale (the leaves remember the factor their gradient was computed with). With
  // float32 master weights a 16-bit gradient is widened to float32 first: unscaled in float16,
  // the small gradients that loss scaling saved from underflow would underflow again. The hooks
  // and the update then see the float32 gradient (Note [Float32 master weights]).
  // A widened gradient that nothing changes (no loss scale to undo, no hooks) gets its 16-bit
  // array back after the update instead of being rounded again: the same bits, one cast fewer.
  std::vector<Array> narrow_grads(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    ParamState& s = states[i];
    const double scale = s.param.impl().loss_scale;
    Array grad = s.param.grad();
    if (!grad.defined()) continue;
    if (fp32_update_ && is_half_precision(grad.dtype())) {
      if (scale == 1.0 && hooks_.empty()) narrow_grads[i] = grad;
      grad = grad.astype(Dtype::kFloat32);
      s.param.set_grad(grad);
    }
    if (scale != 1.0) {
      s.param.set_grad(grad * (1.0 / scale));
      s.param.impl().loss_scale = 1.0;
    }
  }
  skip_ = Array();  // (in case an earlier update() threw half-way; the verdict was taken)
  verdict_.stepped.clear();
  if (dynamic_loss_scaling_) {
    bool one_device = true;
    Array bad = overflow_count(states, &one_device);
    if (shard_sum_) {
      // Sharded: every process takes the verdict of the whole gradient (and the same one).
      const double local = bad.defined() ? static_cast<double>(bad.item<int64_t>()) : 0.0;
      if (!loss_scale_verdict(static_cast<int64_t>(shard_sum_(local)))) {
        target_->cleargrads();
        return;
      }
    } else if (bad.defined() && one_device && hooks_.empty() && skips_on_device()) {
      skip_ = std::move(bad);  // decided on the device, learnt later
    } else if (!loss_scale_verdict(bad.defined() ? bad.item<int64_t>() : 0)) {
      target_->cleargrads();
      return;
    }
  }
  call_hooks(OptimizerHook::Timing::kPre);
  ++t_;  // before the updates: see Note [Optimizer step order]
  std::vector<GroupedStep> grouped;
  for (size_t i = 0; i < states.size(); ++i) {
    ParamState& s = states[i];
    if (!s.param.impl().update_enabled || !s.param.grad().defined()) continue;
    if (skip_.defined()) verdict_.stepped.push_back(i);  // (empty: the last verdict was taken)
    const bool fp32_master = uses_master(s);
    Parameter real = s.param;
    if (fp32_master) {
      // Note [Float32 master weights]
      // A float16/bfloat16 parameter is updated through a float32 copy kept in the state as
      // "master" (saved with the optimizer): the step is computed in float32 against it and
      // the parameter is its rounding. Small updates that float16 would round away accumulate.
      // Its gradient was widened to float32 before the loss scale was undone, so the kPre hooks
      // and the step see it in float32; it is rounded back to the parameter's dtype after the
      // step, so that gradients outside update() always have their parameter's dtype.
      if (!s.find("master")) s.add("master", real.data().astype(Dtype::kFloat32, true));
      Parameter master(s.get("master"));
      master.set_grad(real.grad().astype(Dtype::kFloat32));
      s.param = master;
    }
    if (!s.initialized) {
      init_state(s);
      s.initialized = true;
    } else {
      // The state follows its parameter when the link moved to another device.
      const Device device = s.param.data().device();
      for (auto& [name, a] : s.arrays) {
        if (a.defined() && a.device() != device) a = a.to_device(device);
      }
    }
    ++s.t;
    std::optional<UpdateStep> step = multi_tensor_update_ ? update_step(s) : std::nullopt;
    if (step) {
      grouped.push_back({i, std::move(*step), s.param.data(), s.param.grad(), fp32_master});
    } else {
      update_one(s);
      ++last_update_calls_;
    }
    if (fp32_master) s.param = real;
    if (fp32_master && !step) {
      Array data = real.data();
      data.assign(s.get("master"));  // (rounds as astype does, in one pass)
    }
  }
  run_grouped_steps(grouped);
  for (const GroupedStep& u : grouped) {
    if (!u.master) continue;
    ParamState& s = states[u.index];
    Array data = s.param.data();
    data.assign(s.get("master"));
  }
  for (size_t i = 0; i < states.size(); ++i) {
    ParamState& s = states[i];
    const Array grad = s.param.grad();
    if (!grad.defined() || grad.dtype() == s.param.dtype()) continue;
    s.param.set_grad(narrow_grads[i].defined() ? narrow_grads[i] : grad.astype(s.param.dtype()));
  }
  if (skip_.defined()) {
    verdict_.pending = true;
    verdict_.on_gpu = skip_.device().is_cuda();
    if (verdict_.on_gpu) {
      reader_.start(skip_);  // queued behind the count, before work queued later
    } else {
      verdict_.count = skip_.item<int64_t>();  // (nothing to wait for on the CPU)
    }
    skip_ = Array();
  }
  call_hooks(OptimizerHook::Timing::kPost);
}

void Optimizer::loss_scaling(int64_t interval, std::optional<double> scale) {
  KUSARI_CHECK(interval > 0, ValueError, type_name(), "::loss_scaling: interval must be positive, got ", interval);
  KUSARI_CHECK(!scale || *scale > 0, ValueError, type_name(), "::loss_scaling: scale must be positive, got ", *scale);
  dynamic_loss_scaling_ = !scale;
  loss_scale_ = scale ? *scale : 65536.0;
  loss_scale_interval_ = interval;
  good_steps_ = 0;
}

// Note [Dynamic loss scaling]
// With loss_scaling() and no fixed scale, the loss is multiplied by a scale (initially 2^16)
// before backward. If any gradient then holds Inf or NaN (float16 overflow), the step is skipped
// and the scale halved; after `interval` good steps in a row it is doubled. All ranks of a
// data-parallel job see the same averaged gradients, so they decide alike. The scale and the
// count of good steps are saved with the optimizer (serialize), unlike Chainer.
//
// Whether a step overflowed is a count on the GPU (count_nonfinite over all gradients). Reading
// it before the updates (item()) makes the host wait for the whole backward every step, and the
// GPU then idles while the host queues the next step: a step costs the host's time plus the
// GPU's instead of the larger of the two (PyTorch's GradScaler reads it so in step()). For a
// host-bound model the GPU's queue is short and this costs little (docs/benchmarks.md, "Mixed
// precision on GPUs"); for a model whose GPU time per step is comparable to the host's it costs
// up to half the throughput. So when every update goes through the fused update kernels
// (skips_on_device()), the gradients are on one device and no hook would see them, the count
// itself is the kernels' skip flag: an overflowing step leaves every parameter and state
// untouched on the device. The host queues the updates at once as if the step were good,
// queues a read of the count into pinned memory right behind it (cuda::ScalarReader), and takes the
// verdict later: before the next backward needs the scale (loss_scale(), update(lossfun)), or when
// t(), param_states() or serialize() is asked. By then the count has long arrived, and the GPU has
// the updates and the next forward queued while the host waits for it. A skipped step is then taken
// back from the counts: t and the step count of each parameter it stepped are decremented (Adam's
// bias correction uses them), and the scale is halved. The parameters, states, counts and scales
// are those of the synchronous order in every step; only the gradients of an overflowing step are
// left as they were (the next backward clears them), instead of cleared at once. Otherwise (a
// hook, a custom update, gradients on several devices) the count is read before the updates.
Array Optimizer::overflow_count(std::vector<ParamState>& states, bool* one_device) const {
  std::vector<Array> grads;
  for (ParamState& s : states) {
    const Array& g = s.param.grad();
    if (!g.defined()) continue;
    if (!grads.empty() && g.device() != grads.front().device()) *one_device = false;
    grads.push_back(g);
  }
  if (grads.empty()) return Array();
  if (*one_device) return count_nonfinite(grads);  // (one pass, a launch per 48 gradients)
  Array bad;
  for (const Array& g : grads) {
    Array b = count_nonfinite({g}).to_device(grads.front().device());
    bad = bad.defined() ? bad + b : b;
  }
  return bad;
}

bool Optimizer::loss_scale_verdict(int64_t bad) {
  if (bad != 0) {
    loss_scale_ = std::max(1.0, loss_scale_ / 2);
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= loss_scale_interval_) {
    loss_scale_ = std::min(loss_scale_ * 2, 1.0 * (int64_t{1} << 40));
    good_steps_ = 0;
  }
  return true;
}

void Optimizer::settle_loss_scale() const {
  if (!verdict_.pending) return;
  auto& self = const_cast<Optimizer&>(*this);
  Verdict& v = self.verdict_;
  v.pending = false;
  const int64_t bad = v.on_gpu ? self.reader_.get() : v.count;
  if (!self.loss_scale_verdict(bad)) {
    --self.t_;
    for (size_t i : v.stepped) --self.states_[i].t;
  }
  v.stepped.clear();
}

void Optimizer::update(const std::function<Variable()>& lossfun) {
  KUSARI_CHECK(target_, ValueError, type_name(), ": call setup(link) before update");
  Variable loss = lossfun();
  target_->cleargrads();
  settle_loss_scale();  // (the last step's verdict decides this backward's scale)
  BackwardOptions options;
  if (loss_scale_ != 1.0) options.loss_scale = loss_scale_;
  options.retain_graph = false;  // the loss is dropped next (Note [Freeing the graph during backward])
  loss.backward(options);
  loss = Variable();
  update();
}

void Optimizer::update_accumulated(int64_t n, const std::function<Variable(int64_t)>& lossfun) {
  KUSARI_CHECK(target_, ValueError, type_name(), ": call setup(link) before update");
  KUSARI_CHECK(n >= 1, ValueError, type_name(), "::update_accumulated: the number of micro-batches must be positive, "
               "got ", n);
  target_->cleargrads();
  settle_loss_scale();
  for (int64_t i = 0; i < n; ++i) {
    Variable loss = lossfun(i);
    if (n > 1) loss = functions::mul(loss, 1.0 / static_cast<double>(n));
    BackwardOptions options;
    if (loss_scale_ != 1.0) options.loss_scale = loss_scale_;
    options.retain_graph = false;
    loss.backward(options);
  }
  update();
}

void Optimizer::add_hook(std::shared_ptr<OptimizerHook> hook, const std::string& name_in) {
  KUSARI_CHECK(hook, ValueError, type_name(), "::add_hook: the hook is null");
  std::string name = name_in.empty() ? hook->name() : name_in;
  for (auto& [n, h] : hooks_) {
    KUSARI_CHECK(n != name, ValueError, type_name(), "::add_hook: a hook named '", name, "' already exists");
  }
  hooks_.emplace_back(name, std::move(hook));
}

void Optimizer::remove_hook(const std::string& name) {
  auto it = std::find_if(hooks_.begin(), hooks_.end(), [&](const auto& h) { return h.first == name; });
  KUSARI_CHECK(it != hooks_.end(), ValueError, type_name(), "::remove_hook: no hook named '", name, "'");
  hooks_.erase(it);
}

void Optimizer::declare_hyperparam(const std::string& name, double value) {
  for (auto& [n, v] : hyperparams_) {
    if (n == name) {
      v = value;
      return;
    }
  }
  hyperparams_.emplace_back(name, value);
}

double& Optimizer::hyperparam(const std::string& name) {
  for (auto& [n, v] : hyperparams_) {
    if (n == name) return v;
  }
  std::ostringstream names;
  for (size_t i = 0; i < hyperparams_.size(); ++i) names << (i ? ", " : "") << hyperparams_[i].first;
  KUSARI_THROW(ValueError, type_name(), ": no hyperparameter named '", name, "' (it has: ", names.str(), ")");
}

void Optimizer::set_hyperparam_where(const std::string& name, double value,
                                     std::function<bool(const std::string&, const Parameter&)> select) {
  hyperparam(name);  // ValueError naming the valid ones
  const std::vector<std::string> allowed = per_parameter_hyperparams();
  if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
    std::ostringstream names;
    for (size_t i = 0; i < allowed.size(); ++i) names << (i ? ", " : "") << allowed[i];
    KUSARI_THROW(ValueError, type_name(), ": set_hyperparam_where('", name, "'): ", type_name(),
                 " reads '", name, "' once for all parameters; it reads per parameter: ",
                 allowed.empty() ? std::string("none") : names.str());
  }
  KUSARI_CHECK(static_cast<bool>(select), ValueError, type_name(), ": set_hyperparam_where('", name,
               "') needs a selector, got an empty function");
  hyperparam_rules_.push_back({name, value, std::move(select)});
}

double Optimizer::hyperparam_for(const ParamState& state, const std::string& name) const {
  for (auto r = hyperparam_rules_.rbegin(); r != hyperparam_rules_.rend(); ++r) {
    if (r->name == name && r->select(state.path, state.param)) return r->value;
  }
  return hyperparam(name);
}

bool Optimizer::has_hyperparam(const std::string& name) const {
  return std::any_of(hyperparams_.begin(), hyperparams_.end(), [&](const auto& h) { return h.first == name; });
}

std::vector<std::string> Optimizer::hyperparam_names() const {
  std::vector<std::string> names;
  for (const auto& [n, v] : hyperparams_) names.push_back(n);
  return names;
}

void Optimizer::serialize(Serializer& s) {
  // One process's file of a sharded optimizer's snapshot holds only that process's part of the
  // state (kusari::mn, Note [Sharded snapshot files]): refuse it rather than load a part.
  const bool part = s.is_loading() && s.contains(optimizers::detail::kShardLayoutKey);
  KUSARI_CHECK(!part, IOError, type_name(), ": the snapshot at '", s.path(), "' is one process's part of the "
               "state of an optimizer that several processes sharded (zero_stage); load the files of all the processes of that save together "
               "(kusari::mn::load_newest_snapshot_set, load_snapshot_files) or merge them into one "
               "(kusari::mn::merge_snapshot_files)");
  settle_loss_scale();
  s.count("t", t_);
  s.count("epoch", epoch_);
  // Dynamic loss scaling's state (Note [Dynamic loss scaling]), so that a resumed float16 run
  // goes on with the scale it had instead of overflowing its way down from 2^16 again. Saved
  // only while dynamic scaling is on, so other snapshots keep Chainer's layout; a snapshot
  // without it (Chainer's, or saved without scaling) leaves the scale as configured.
  if (dynamic_loss_scaling_ && s.contains("loss_scale") && s.contains("loss_scale_good_steps")) {
    s("loss_scale", loss_scale_);
    s("loss_scale_good_steps", good_steps_);
  }
  if (!target_) return;
  // Parameters without data yet: see Note [Loading lazy states].
  for (auto& [path, p] : target_->namedparams(true)) {
    if (p.is_initialized()) continue;
    auto child = s.child(path.substr(1));
    if (s.is_loading()) {
      if (!child->contains("t")) continue;
      ParamState probe;
      probe.path = path;
      probe.param = Parameter(Array::zeros({1}, Dtype::kFloat32, Device::cpu()));
      init_state(probe);
      ParamState loaded;
      loaded.path = path;
      loaded.param = p;
      loaded.initialized = true;
      (*child)("t", loaded.t);
      if (child->contains("master")) {
        Array value;
        (*child)("master", value);
        loaded.arrays.emplace_back("master", std::move(value));
      }
      for (auto& [name, a] : probe.arrays) {
        Array value;
        (*child)(name, value);
        loaded.arrays.emplace_back(name, std::move(value));
      }
      std::erase_if(pending_, [&](const ParamState& q) { return q.path == path; });
      pending_.push_back(std::move(loaded));
    } else {
      for (ParamState& q : pending_) {
        if (q.path != path || !q.param.is(p)) continue;
        (*child)("t", q.t);
        for (auto& [name, a] : q.arrays) (*child)(name, a);
      }
    }
  }
  for (ParamState& st : param_states()) {
    auto child = s.child(st.path.substr(1));
    if (s.is_loading()) {
      if (!child->contains("t")) continue;
      if (!st.initialized) init_state_to_load(st);
      if (uses_master(st)) {
        if (child->contains("master")) {
          if (!st.find("master")) st.add("master", Array::zeros(st.param.shape(), Dtype::kFloat32, st.param.device()));
        } else {
          // Saved without use_fp32_update: the next update makes the master copy from the
          // parameter as loaded (the updater loads the model after the optimizer).
          std::erase_if(st.arrays, [](const auto& e) { return e.first == "master"; });
        }
      }
    } else if (!st.initialized) {
      continue;
    }
    (*child)("t", st.t);
    for (auto& [name, a] : st.arrays) (*child)(name, a);
  }
}

}  // namespace kusari
