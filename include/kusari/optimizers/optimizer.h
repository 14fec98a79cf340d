// Optimizers (Chainer's chainer.Optimizer with its per-parameter update rules) and hooks.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/cuda.h"
#include "kusari/core/op_types.h"
#include "kusari/links/link.h"
#include "kusari/serializers/serializer.h"

namespace kusari {

/// What an optimizer keeps for one parameter: named state arrays (moment estimates, ...) and
/// the number of updates applied to it.
struct ParamState {
  /// Path of the parameter in the target link, e.g. "/l1/W".
  std::string path;
  /// The parameter this state belongs to.
  Parameter param;
  /// Named state arrays in creation order ("m", "v", ...); the names are the serialization keys.
  std::vector<std::pair<std::string, Array>> arrays;
  /// Number of updates applied to this parameter (Chainer's UpdateRule.t).
  int64_t t = 0;
  /// True once init_state() has run (or a state was loaded).
  bool initialized = false;

  /// The state array `name` (ValueError when missing).
  Array& get(const std::string& name);
  /// The state array `name`, or null when there is none.
  Array* find(const std::string& name);
  /// Adds a state array (zeros like the parameter unless given).
  void add(const std::string& name, Array value);
};

class Optimizer;

/// A function called by Optimizer::update() before (kPre, the default) or after (kPost) the
/// parameter updates, e.g. weight decay or gradient clipping.
class OptimizerHook {
 public:
  /// When the hook runs: before (kPre) or after (kPost) the parameter updates.
  enum class Timing { kPre, kPost };
  virtual ~OptimizerHook() = default;
  /// The hook's default name ("WeightDecay", ...).
  virtual const char* name() const = 0;
  /// When the hook runs (kPre unless the hook says otherwise).
  virtual Timing timing() const { return Timing::kPre; }
  /// Applies the hook to the optimizer's parameters (e.g. to their gradients).
  virtual void operator()(Optimizer& optimizer) = 0;
};

/// Updates the parameters of a target link from their gradients.
///
/// Note [Optimizer step order]
/// update() runs as Chainer's Optimizer.update does: undo the loss scale, call the kPre hooks,
/// increment t, update every parameter whose update is enabled and that has a gradient (its own
/// step count ParamState::t is incremented first), then call the kPost hooks. So during the
/// parameter updates and the kPost hooks, and after update() returns, t() counts the step just
/// taken, which is what Adam's lr() and schedules read. Unlike Chainer, a parameter without a
/// gradient is skipped (Chainer fills missing gradients with zeros and steps anyway).
///
/// Note [Optimizer hyperparameters]
/// Hyperparameters live in a name -> value table ("lr", "momentum", "alpha", ...) so that
/// schedules (ExponentialShift("lr", 0.5)) and observers (observe_lr) reach them by name, as in
/// Chainer; each optimizer also has typed accessors for its own.
class Optimizer : public Serializable {
 public:
  ~Optimizer() override = default;

  /// Attaches the optimizer to the link whose parameters it updates.
  virtual void setup(std::shared_ptr<Link> target);
  /// Attaches the optimizer to another link that holds the same parameters or parts of them (a
  /// sharded multi-node optimizer's shard), keeping t, epoch and the loss scale; the
  /// per-parameter states are dropped (the caller moves them into the new parameters' states).
  void retarget(std::shared_ptr<Link> target);
  /// The link being optimised (null before setup()).
  Link* target() const { return target_.get(); }
  /// The link being optimised, shared.
  const std::shared_ptr<Link>& target_ptr() const { return target_; }

  /// One step from the gradients already in the parameters.
  virtual void update();
  /// Clears the gradients, computes lossfun() and its gradients, then takes one step.
  virtual void update(const std::function<Variable()>& lossfun);
  /// Gradient accumulation: clears the gradients, adds those of lossfun(0), ..., lossfun(n - 1)
  /// each divided by n (the gradient of the mean loss over n micro-batches: one step as with a
  /// batch n times larger, in the memory of one micro-batch), then takes one step. Each
  /// micro-batch's graph is freed by its backward. A multi-node optimizer averages over the
  /// processes once, after the last micro-batch.
  virtual void update_accumulated(int64_t n, const std::function<Variable(int64_t)>& lossfun);

  /// Adds a hook (its name defaults to hook->name()); names must be unique.
  virtual void add_hook(std::shared_ptr<OptimizerHook> hook, const std::string& name = "");
  /// Removes the hook `name` (ValueError when there is none).
  virtual void remove_hook(const std::string& name);

  /// Called by iterators' epoch boundaries through the updater.
  virtual void new_epoch() { ++epoch_; }
  /// Number of update() calls so far (see Note [Optimizer step order]); a step that dynamic loss
  /// scaling skipped does not count.
  virtual int64_t t() const {
    settle_loss_scale();
    return t_;
  }
  /// Number of new_epoch() calls so far.
  virtual int64_t epoch() const { return epoch_; }

  /// The hyperparameter `name` (ValueError listing the valid names when unknown).
  virtual double& hyperparam(const std::string& name);
  /// The value of the hyperparameter `name` (ValueError listing the valid names when unknown).
  double hyperparam(const std::string& name) const { return const_cast<Optimizer*>(this)->hyperparam(name); }
  /// True when the optimizer has a hyperparameter called `name`.
  virtual bool has_hyperparam(const std::string& name) const;
  /// The hyperparameter names in declaration order.
  std::vector<std::string> hyperparam_names() const;
  /// The learning rate steps are taken with (observe_lr reports it); Adam's depends on t.
  virtual double lr() const { return hyperparam("lr"); }
  /// Gives the parameters that `select` picks (by path, "/h/0/ln_1/gamma", and parameter) their
  /// own fixed value of the hyperparameter `name` (Chainer's param.update_rule.hyperparam.NAME,
  /// PyTorch's parameter groups); the others keep the optimizer's value, schedules included.
  /// Where several calls pick a parameter, the last one wins. `name` must be one that the
  /// optimizer reads per parameter (per_parameter_hyperparams(): Adam's and AdamW's beta1,
  /// beta2, eps, eta and weight_decay_rate; LAMB's and LARS's), else ValueError. The usual use,
  /// no decay on biases and normalization scales:
  ///   opt.set_hyperparam_where("weight_decay_rate", 0.0, optimizers::is_bias_or_norm (hooks.h));
  /// Not serialized (configuration, like the hooks): a resumed run sets it again.
  virtual void set_hyperparam_where(const std::string& name, double value,
                                    std::function<bool(const std::string& path, const Parameter& param)> select);
  /// The hyperparameters that set_hyperparam_where can set for some parameters.
  virtual std::vector<std::string> per_parameter_hyperparams() const { return {}; }
  /// The value of the hyperparameter `name` that `state`'s parameter is stepped with.
  virtual double hyperparam_for(const ParamState& state, const std::string& name) const;

  /// The per-parameter states, in sorted parameter-path order, refreshed against the target's
  /// current parameters (lazily sized parameters appear once initialised).
  virtual std::vector<ParamState>& param_states();

  /// Loss scale used by update(lossfun) (1 = none); gradients are divided by it before hooks.
  virtual void set_loss_scale(double scale) { loss_scale_ = scale; }
  /// The loss scale used by update(lossfun) (with dynamic scaling: for the next backward).
  virtual double loss_scale() const {
    settle_loss_scale();
    return loss_scale_;
  }
  /// Loss scaling for float16 training (Chainer's loss_scaling): a fixed `scale`, or, without
  /// one, dynamic scaling (see Note [Dynamic loss scaling]).
  virtual void loss_scaling(int64_t interval = 1000, std::optional<double> scale = std::nullopt);
  /// Updates float16/bfloat16 parameters through float32 master copies (Chainer's
  /// use_fp32_update).
  virtual void use_fp32_update(bool flag = true) { fp32_update_ = flag; }

  /// Steps the parameters in groups through the multi-tensor update kernel (true, the default)
  /// or one parameter at a time (false); the results are the same bit for bit (Note [Grouped
  /// optimizer updates]).
  virtual void use_multi_tensor_update(bool flag = true) { multi_tensor_update_ = flag; }
  /// True when update() steps the parameters in groups.
  virtual bool multi_tensor_update() const { return multi_tensor_update_; }
  /// The number of update routine calls the last update() made: one per group of parameters
  /// stepped together (kusari::update_parameters), plus one per parameter stepped alone
  /// (update_one). 0 when the step was skipped or nothing had a gradient.
  virtual int64_t last_update_calls() const { return last_update_calls_; }

  /// Saves or loads t, epoch and the per-parameter states ("l1/W/m", ...), Chainer's layout;
  /// with dynamic loss scaling also "loss_scale" and "loss_scale_good_steps".
  void serialize(Serializer& serializer) override;
  /// The optimizer's class name ("Adam", ...), used in messages.
  virtual const char* type_name() const = 0;
  /// True when every parameter's step is elementwise (each element is stepped from the same
  /// element of its gradient and state alone), so that a parameter can be stepped in pieces: a
  /// sharded multi-node optimizer then splits parameters between processes (Note [Sharded
  /// optimizer] in src/mn/reduce/sharded_update.cc). False, the default, for steps that need the
  /// whole parameter, such as LARS's and LAMB's trust ratios.
  virtual bool steps_elementwise() const { return false; }
  /// Set by a sharded multi-node optimizer on the optimizer it wraps, whose parameters are then
  /// this process's shard: sums a number over the shards of every process (GradientClipping's
  /// global norm, dynamic loss scaling's overflow count). Called by every process in the same
  /// order. Unset (the default): the number itself.
  void set_shard_sum(std::function<double(double)> sum) { shard_sum_ = std::move(sum); }
  /// `local` summed over the shards of every process (`local` when not sharded).
  double sum_over_shards(double local) const { return shard_sum_ ? shard_sum_(local) : local; }

 protected:
  /// Declares a hyperparameter with its default value (constructors call this).
  void declare_hyperparam(const std::string& name, double value);
  /// Allocates the per-parameter state before the parameter's first update.
  virtual void init_state(ParamState& state) {}
  /// One parameter's step as the fused update kernels take it (kusari::update_parameter's
  /// arguments but the parameter and gradient): the rule, its hyperparameters and the state
  /// arrays (pointers into the ParamState's arrays).
  struct UpdateStep {
    UpdateRule rule;
    std::vector<double> hyper;
    std::vector<Array*> state;
  };
  /// The step of `state`'s parameter (its state initialised, its t already incremented), or
  /// nullopt when the optimizer computes its steps in update_one. The built-in optimizers
  /// describe every step so; update() then steps parameters of one dtype, device and step
  /// together (Note [Grouped optimizer updates]).
  virtual std::optional<UpdateStep> update_step(ParamState& state) { return std::nullopt; }
  /// Applies one step to one parameter whose gradient is present. The default applies
  /// update_step() through kusari::update_parameter; an optimizer without update_step()
  /// overrides this.
  virtual void update_one(ParamState& state);
  /// True when every step goes through kusari::update_parameter (or update_parameters) with
  /// skip_flag(), as update_step()'s steps do: dynamic loss scaling then skips an overflowing step
  /// on the device and learns of it later, instead of reading the overflow count before the updates
  /// (Note [Dynamic loss scaling]). The built-in optimizers do; an optimizer that computes its step
  /// otherwise keeps the default, false, and is checked before its updates.
  virtual bool skips_on_device() const { return false; }
  /// During update(): the flag to pass to kusari::update_parameter (null when none).
  const Array* skip_flag() const { return skip_.defined() ? &skip_ : nullptr; }
  /// Calls the hooks of the given timing in registration order.
  void call_hooks(OptimizerHook::Timing timing);
  /// Moves a state loaded for `s`'s parameter before it had data into `s` (if there is one).
  void adopt_pending(ParamState& s);
  /// True when `s`'s parameter is stepped through a float32 master copy (use_fp32_update on a
  /// float16 or bfloat16 parameter).
  bool uses_master(const ParamState& s) const;
  /// Creates `s`'s state arrays for loading them: init_state() in the dtype of the steps.
  void init_state_to_load(ParamState& s);

  std::shared_ptr<Link> target_;
  std::vector<std::pair<std::string, double>> hyperparams_;
  /// set_hyperparam_where's rules, in the order they were set.
  struct HyperparamRule {
    std::string name;
    double value;
    std::function<bool(const std::string&, const Parameter&)> select;
  };
  std::vector<HyperparamRule> hyperparam_rules_;
  std::vector<std::pair<std::string, std::shared_ptr<OptimizerHook>>> hooks_;
  std::vector<ParamState> states_;
  // States loaded by serialize() for parameters that were not initialised yet (lazily sized
  // links); adopted by param_states() once the parameter has data. See Note [Loading lazy states].
  std::vector<ParamState> pending_;
  int64_t t_ = 0;
  int64_t epoch_ = 0;
  double loss_scale_ = 1.0;
  bool fp32_update_ = false;
  bool multi_tensor_update_ = true;
  int64_t last_update_calls_ = 0;
  bool dynamic_loss_scaling_ = false;
  int64_t loss_scale_interval_ = 1000;
  int64_t good_steps_ = 0;
  /// set_shard_sum's function (empty when the optimizer is not sharded).
  std::function<double(double)> shard_sum_;

 private:
  /// A parameter's step collected by update() for a group (Note [Grouped optimizer updates]):
  /// the index of its state, the step, the arrays stepped (the master copy and its float32
  /// gradient for a parameter with one) and whether it has a master copy to round back.
  struct GroupedStep {
    size_t index;
    UpdateStep step;
    Array param;
    Array grad;
    bool master;
  };
  /// Steps `steps` in groups, one kusari::update_parameters call each.
  void run_grouped_steps(std::vector<GroupedStep>& steps);
  /// Dynamic loss scaling: the number of non-finite gradient values (an int64 on the gradients'
  /// device, not read), undefined when no gradient is present; `one_device`: all on one device.
  Array overflow_count(std::vector<ParamState>& states, bool* one_device) const;
  /// Dynamic loss scaling's verdict on a step with `bad` non-finite gradient values: lowers the
  /// scale (false: skip the step) or counts a good step (true).
  bool loss_scale_verdict(int64_t bad);
  /// Takes the verdict on the last update() whose overflow count is still being read, if any:
  /// undoes its step counts when it overflowed (Note [Dynamic loss scaling]). Logically const:
  /// the step was already decided on the device, this only learns how.
  void settle_loss_scale() const;
  /// The update() whose verdict is pending: the overflow count it passed as skip_flag() (read
  /// through `reader_` on a GPU, or known at once on the CPU), and the states it stepped.
  struct Verdict {
    bool pending = false;
    bool on_gpu = false;
    int64_t count = 0;
    std::vector<size_t> stepped;
  };
  Verdict verdict_;
  cuda::ScalarReader reader_;
  Array skip_;
};

}  // namespace kusari
