#include "kusari/training/extension.h"

namespace kusari::training {

namespace {

class FunctionExtension : public Extension {
 public:
  FunctionExtension(std::function<void(Trainer&)> fn, std::string name, std::shared_ptr<Trigger> trigger,
                    int priority)
      : fn_(std::move(fn)), name_(std::move(name)), trigger_(std::move(trigger)), priority_(priority) {}
  void operator()(Trainer& trainer) override { fn_(trainer); }
  std::string default_name() const override { return name_; }
  std::shared_ptr<Trigger> default_trigger() const override {
    return trigger_ ? trigger_ : Extension::default_trigger();
  }
  int priority() const override { return priority_; }

 private:
  std::function<void(Trainer&)> fn_;
  std::string name_;
  std::shared_ptr<Trigger> trigger_;
  int priority_;
};

}  // namespace

std::shared_ptr<Extension> make_extension(std::function<void(Trainer&)> fn, std::string name,
                                          std::shared_ptr<Trigger> trigger, int priority) {
  KUSARI_CHECK(fn, ValueError, "make_extension: the function is empty");
  return std::make_shared<FunctionExtension>(std::move(fn), std::move(name), std::move(trigger), priority);
}

}  // namespace kusari::training
