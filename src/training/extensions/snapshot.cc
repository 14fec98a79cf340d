#include "kusari/training/extensions/snapshot.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "kusari/serializers/npz.h"
#include "kusari/training/trainer.h"

namespace kusari::training::extensions {

namespace fs = std::filesystem;

namespace {

const char* kIterationField = "{.updater.iteration}";
const char* kEpochField = "{.updater.epoch}";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

std::string regex_escape(const std::string& s) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(s, special, R"(\$&)");
}

// The file name pattern as a regular expression, each field turned into a number group.
std::regex filename_regex(const std::string& filename) {
  std::string pattern = regex_escape(filename);
  pattern = replace_all(pattern, regex_escape(kIterationField), "([0-9]+)");
  pattern = replace_all(pattern, regex_escape(kEpochField), "([0-9]+)");
  return std::regex("^" + pattern + "$");
}

}  // namespace

Snapshot::Snapshot(Serializable* target, SnapshotOptions options) : target_(target), options_(std::move(options)) {
  KUSARI_CHECK(!options_.filename.empty(), ValueError, "snapshot: the file name pattern is empty");
  KUSARI_CHECK(options_.n_retains != 0, ValueError, "snapshot: n_retains must be positive or -1 (keep all)");
}

void Snapshot::set_filename(std::string filename) {
  KUSARI_CHECK(!filename.empty(), ValueError, "snapshot: the file name pattern is empty");
  options_.filename = std::move(filename);
}

std::string Snapshot::default_name() const { return target_ ? "snapshot_object" : "snapshot"; }

std::string Snapshot::filename_for(Trainer& trainer) const {
  std::string name = replace_all(options_.filename, kIterationField, std::to_string(trainer.updater().iteration()));
  return replace_all(name, kEpochField, std::to_string(trainer.updater().epoch()));
}

std::vector<std::string> Snapshot::find_snapshots(const std::string& dir) const {
  const std::regex re = filename_regex(options_.filename);
  std::vector<std::pair<std::vector<long long>, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (entry.is_regular_file() && std::regex_match(name, m, re)) {
      std::vector<long long> key;
      for (size_t i = 1; i < m.size(); ++i) key.push_back(std::stoll(m[i].str()));
      found.emplace_back(key, name);
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& [k, n] : found) names.push_back(n);
  return names;
}

std::vector<std::string> Snapshot::remove_stale_temporaries(
    const std::string& dir, fs::file_time_type modified_before) const {
  const std::regex re = filename_regex(options_.filename);
  return remove_stale_temporary_files(
      dir, [&re](const std::string& target) { return std::regex_match(target, re); },
      modified_before);
}

void Snapshot::initialize(Trainer& trainer) {
  // Before anything else: what snapshots of an earlier, killed run left half-written.
  remove_stale_temporaries(trainer.out(), fs::file_time_type::clock::now());
  if (!options_.autoload) return;
  std::vector<std::string> existing = find_snapshots(trainer.out());
  if (existing.empty()) return;
  const std::string path = (fs::path(trainer.out()) / existing.back()).string();
  load_npz(path, target_ ? *target_ : static_cast<Serializable&>(trainer));
}

void Snapshot::write(Trainer& trainer) {
  const fs::file_time_type started = fs::file_time_type::clock::now();
  fs::create_directories(trainer.out());
  const std::string path = (fs::path(trainer.out()) / filename_for(trainer)).string();
  save_npz(path, target_ ? *target_ : static_cast<Serializable&>(trainer), options_.compression);
  // Note [Snapshot files on disk]
  remove_stale_temporaries(trainer.out(), started);
  if (options_.n_retains > 0) {
    std::vector<std::string> existing = find_snapshots(trainer.out());
    const size_t keep = static_cast<size_t>(options_.n_retains);
    for (size_t i = 0; i + keep < existing.size(); ++i) {
      std::error_code ec;
      fs::remove(fs::path(trainer.out()) / existing[i], ec);
    }
  }
}

void Snapshot::operator()(Trainer& trainer) { write(trainer); }

void Snapshot::on_error(Trainer& trainer, const std::exception&) {
  if (options_.snapshot_on_error) write(trainer);
}

std::shared_ptr<Snapshot> snapshot(SnapshotOptions options) {
  return std::make_shared<Snapshot>(nullptr, std::move(options));
}

std::shared_ptr<Snapshot> snapshot_object(Serializable& target, const std::string& filename,
                                          SnapshotOptions options) {
  options.filename = filename;
  return std::make_shared<Snapshot>(&target, std::move(options));
}

}  // namespace kusari::training::extensions
