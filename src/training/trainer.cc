#include "kusari/training/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

namespace kusari::training {

namespace {

// Note [Probing the output folder]
// A folder that exists but cannot be written (read-only mount, wrong owner, a path that is a
// file) used to surface only when the first log or snapshot was written, after a whole epoch
// of training. run() therefore writes and removes a small probe file before the first
// iteration. The name holds the process id so that the processes of a multi-node job sharing
// one folder do not race on the same probe.
void check_writable(const std::string& out) {
  const std::filesystem::path probe =
      std::filesystem::path(out) / (".kusari_write_probe." + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  const int err = errno;
  KUSARI_CHECK(f != nullptr, IOError, "Trainer::run: the output folder '", out,
               "' is not writable (creating '", probe.filename().string(), "' in it failed: ",
               std::strerror(err), "); logs and snapshots could not be saved");
  const bool written = std::fputc('k', f) != EOF;
  const bool closed = std::fclose(f) == 0;
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  KUSARI_CHECK(written && closed, IOError, "Trainer::run: the output folder '", out,
               "' is not writable (writing a probe file in it failed); logs and snapshots could "
               "not be saved");
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Updater> updater, std::shared_ptr<Trigger> stop_trigger, std::string out)
    : updater_(std::move(updater)), stop_trigger_(std::move(stop_trigger)), out_(std::move(out)) {
  KUSARI_CHECK(updater_, ValueError, "Trainer: the updater is null");
  if (!stop_trigger_) stop_trigger_ = interval(20, "epoch");
  // Reports from the model go to "main/...", from its sub-links to "main/<path>/..."; with several
  // optimizers, each target under the optimizer's name ("gen/loss", "dis/loss").
  for (auto& [name, optimizer] : updater_->all_optimizers()) {
    Link* target = optimizer->target();
    if (!target) continue;
    reporter_.add_observer(name, target);
    std::vector<std::pair<std::string, const void*>> links;
    for (auto& [path, link] : target->namedlinks(true)) links.emplace_back(path, link);
    reporter_.add_observers(name, links);
  }
}

void Trainer::extend(std::shared_ptr<Extension> extension, const std::string& name_in,
                     std::shared_ptr<Trigger> trigger, std::optional<int> priority) {
  KUSARI_CHECK(extension, ValueError, "Trainer::extend: the extension is null");
  std::string base = name_in.empty() ? extension->default_name() : name_in;
  // Chainer numbers duplicates: "name", "name_1", "name_2", ...
  std::string name = base;
  for (int k = 1; std::any_of(extensions_.begin(), extensions_.end(), [&](const Entry& e) { return e.name == name; });
       ++k) {
    name = base + "_" + std::to_string(k);
  }
  extension->set_name(name);
  Entry e{name, extension, trigger ? trigger : extension->default_trigger(),
          priority ? *priority : extension->priority(), extensions_.size()};
  extensions_.push_back(std::move(e));
}

Extension& Trainer::get_extension(const std::string& name) {
  for (Entry& e : extensions_) {
    if (e.name == name) return *e.extension;
  }
  KUSARI_THROW(ValueError, "Trainer: no extension named '", name, "'");
}

double Trainer::elapsed_time() const {
  double now = 0;
  if (start_) now = std::chrono::duration<double>(std::chrono::steady_clock::now() - *start_).count();
  return elapsed_before_ + now;
}

void Trainer::run() {
  KUSARI_CHECK(!done_, ValueError, "Trainer::run: this trainer has already finished; create a new one");
  if (!out_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_, ec);
    KUSARI_CHECK(!ec, IOError, "Trainer::run: cannot create the output folder '", out_, "': ", ec.message());
    check_writable(out_);
  }
  std::stable_sort(extensions_.begin(), extensions_.end(),
                   [](const Entry& a, const Entry& b) { return a.priority > b.priority; });
  auto finalize_all = [&]() {
    for (Entry& e : extensions_) e.extension->finalize();
    updater_->finalize();
  };
  try {
    // Inside the try: an extension failing to initialize (e.g. a corrupt snapshot to resume
    // from) still gets the others' on_error and finalize (threads joined, files closed).
    for (Entry& e : extensions_) e.extension->initialize(*this);
    updater_->connect_trainer(*this);
    start_ = std::chrono::steady_clock::now();
    while (!(*stop_trigger_)(*this)) {
      observation_.clear();
      ReporterScope scope(reporter_, observation_);
      updater_->update();
      for (Entry& e : extensions_) {
        if ((*e.trigger)(*this)) (*e.extension)(*this);
      }
    }
  } catch (const std::exception& ex) {
    for (Entry& e : extensions_) {
      try {
        e.extension->on_error(*this, ex);
      } catch (...) {
        // The original error is the one to report.
      }
    }
    try {
      finalize_all();
    } catch (...) {
    }
    throw;
  }
  finalize_all();
  done_ = true;
}

void Trainer::serialize(Serializer& s) {
  updater_->serialize(*s.child("updater"));
  stop_trigger_->serialize(*s.child("stop_trigger"));
  auto exts = s.child("extensions");
  auto trigs = s.child("extension_triggers");
  for (Entry& e : extensions_) {
    e.extension->serialize(*exts->child(e.name));
    e.trigger->serialize(*trigs->child(e.name));
  }
  double elapsed = elapsed_time();
  s("_snapshot_elapsed_time", elapsed);
  if (s.is_loading()) {
    elapsed_before_ = elapsed;
    if (start_) start_ = std::chrono::steady_clock::now();
  }
}

}  // namespace kusari::training
