#include "kusari/serializers/npz.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kusari/core/error.h"
#include "serializers/file_io.h"
#include "serializers/npy_format.h"
#include "serializers/npz_internal.h"
#include "serializers/zip.h"

namespace kusari {

namespace {

constexpr char kNpySuffix[] = ".npy";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_leading_slashes(const std::string& s) {
  const size_t i = s.find_first_not_of('/');
  return i == std::string::npos ? std::string() : s.substr(i);
}

// "a/b" -> "a/b/", "/a/" -> "a/", "" -> "": the form every path of the protocol has.
std::string normalize_path(const std::string& path) {
  std::string p = strip_leading_slashes(path);
  if (!p.empty() && p.back() != '/') p.push_back('/');
  return p;
}

// The child name as Chainer forms it: surrounding slashes removed.
std::string child_name(const std::string& name) {
  std::string n = strip_leading_slashes(name);
  while (!n.empty() && n.back() == '/') n.pop_back();
  return n;
}

}  // namespace

// --- write / read --------------------------------------------------------------------------------

namespace detail {

void write_npz_impl(const std::string& path, const NamedArrays& arrays, bool compress,
                    const std::string& caller, bool force_zip64) {
  // Check everything that does not need the file first, so that a bad argument leaves no trace.
  std::unordered_set<std::string> seen;
  for (const auto& [key, a] : arrays) {
    KUSARI_CHECK(!key.empty(), ValueError, caller, ": cannot write '", path,
                 "': an array has an empty name");
    KUSARI_CHECK(key.size() + 4 <= 0xffff, ValueError, caller, ": cannot write '", path,
                 "': the name '", key.substr(0, 40),
                 "...' is longer than a ZIP member name can be");
    KUSARI_CHECK(seen.insert(key).second, ValueError, caller, ": cannot write '", path,
                 "': the name '", key, "' appears twice");
    KUSARI_CHECK(a.defined(), ValueError, caller, ": cannot write '", path, "': the array '", key,
                 "' is undefined");
  }
  AtomicOutputFile out(path, caller);
  ZipWriter zip(out, caller, force_zip64);
  for (const auto& [key, a] : arrays) {
    // One array at a time reaches the host, so a model on a GPU needs little extra host memory:
    // the writer encodes a member only when it comes to write it (Note [npz through libzip]).
    const Array& array = a;
    zip.add(key + kNpySuffix, npy_encoded_size(array), compress, [&array] {
      auto encoded = std::make_shared<const NpyEncoded>(npy_encode(array));
      ZipMemberBytes bytes;
      bytes.pieces = {{encoded->preamble.data(), encoded->preamble.size()},
                      {encoded->data.raw_data(), static_cast<size_t>(encoded->data.nbytes())}};
      bytes.owner = std::move(encoded);
      return bytes;
    });
  }
  zip.finish();
  out.commit();
}

}  // namespace detail

void write_npz(const std::string& path, const NamedArrays& arrays, bool compress) {
  detail::write_npz_impl(path, arrays, compress, "write_npz");
}

NamedArrays read_npz(const std::string& path) {
  NpzFile file(path, "read_npz");
  NamedArrays out;
  out.reserve(file.keys().size());
  for (const std::string& key : file.keys()) out.emplace_back(key, file.get(key));
  return out;
}

void write_npy(const std::string& path, const Array& array) {
  KUSARI_CHECK(array.defined(), ValueError, "write_npy: cannot write '", path,
               "': the array is undefined");
  detail::AtomicOutputFile out(path, "write_npy");
  detail::npy_write(detail::npy_encode(array),
                    [&out](const void* data, size_t n) { out.write(data, n); });
  out.commit();
}

Array read_npy(const std::string& path) {
  detail::InputFile file(path, "read_npy");
  uint64_t pos = 0;
  return detail::npy_decode(
      [&](void* dst, size_t n) {
        file.read_at(pos, dst, n, "array data");
        pos += n;
      },
      file.size(), "read_npy: '" + path + "'");
}

// --- NpzFile -------------------------------------------------------------------------------------

struct NpzFile::Impl {
  std::string path;
  std::string caller;
  std::unique_ptr<detail::ZipReader> zip;
  std::vector<std::string> keys;
  std::unordered_map<std::string, size_t> index;  // key -> entry
};

NpzFile::NpzFile(const std::string& path, std::string caller) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->caller = std::move(caller);
  auto file = std::make_shared<const detail::InputFile>(path, impl_->caller);
  impl_->zip = std::make_unique<detail::ZipReader>(std::move(file), impl_->caller);
  const auto& entries = impl_->zip->entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i].name;
    if (!ends_with(name, kNpySuffix)) continue;  // NumPy would return such members as raw bytes
    std::string key = name.substr(0, name.size() - (sizeof(kNpySuffix) - 1));
    // A repeated name (possible in ZIP, never written by NumPy) resolves to the last member,
    // as in Python's zipfile.
    auto [it, inserted] = impl_->index.emplace(key, i);
    if (inserted) {
      impl_->keys.push_back(std::move(key));
    } else {
      it->second = i;
    }
  }
}

NpzFile::~NpzFile() = default;

const std::string& NpzFile::path() const {
  return impl_->path;
}

const std::vector<std::string>& NpzFile::keys() const {
  return impl_->keys;
}

bool NpzFile::contains(const std::string& key) const {
  return impl_->index.count(key) > 0;
}

Array NpzFile::get(const std::string& key) const {
  auto it = impl_->index.find(key);
  KUSARI_CHECK(it != impl_->index.end(), IOError, impl_->caller, ": '", impl_->path,
               "' has no array named '", key, "'");
  const detail::ZipEntry& entry = impl_->zip->entries()[it->second];
  detail::ZipReader::MemberReader member(*impl_->zip, entry);
  const std::string where = impl_->caller + ": '" + impl_->path + "': member '" + entry.name + "'";
  Array a;
  try {
    a = detail::npy_decode([&member](void* dst, size_t n) { member.read(dst, n); },
                           entry.uncompressed_size, where);
  } catch (const IOError&) {
    // Damaged data is the likelier cause of a malformed header: report the CRC mismatch (or
    // broken deflate stream) instead when there is one.
    member.finish();
    throw;
  }
  member.finish();
  return a;
}

// --- sources for NpzDeserializer
// -------------------------------------------------------------------

namespace detail {

/// Where an NpzDeserializer finds its arrays.
struct NpzSource {
  virtual ~NpzSource() = default;
  virtual bool contains(const std::string& key) const = 0;
  /// The stored array, as a new array the caller may keep.
  virtual Array get(const std::string& key) const = 0;
  virtual const std::vector<std::string>& keys() const = 0;
  /// "load_npz: 'model.npz'" -- the start of error messages.
  virtual std::string describe() const = 0;
};

namespace {

class MemorySource : public NpzSource {
 public:
  explicit MemorySource(const NamedArrays& arrays) {
    for (const auto& [key, a] : arrays) {
      auto [it, inserted] = arrays_.emplace(key, a);
      if (inserted) {
        keys_.push_back(key);
      } else {
        it->second = a;
      }
    }
  }
  bool contains(const std::string& key) const override { return arrays_.count(key) > 0; }
  Array get(const std::string& key) const override {
    const Array& a = arrays_.at(key);
    return a.defined() ? a.copy() : a;
  }
  const std::vector<std::string>& keys() const override { return keys_; }
  std::string describe() const override { return "NpzDeserializer: the given arrays"; }

 private:
  std::unordered_map<std::string, Array> arrays_;
  std::vector<std::string> keys_;
};

class FileSource : public NpzSource {
 public:
  FileSource(std::shared_ptr<const NpzFile> file, std::string caller)
      : file_(std::move(file)), caller_(std::move(caller)) {
    KUSARI_CHECK(file_, ValueError, caller_, ": the NpzFile is null");
  }
  bool contains(const std::string& key) const override { return file_->contains(key); }
  Array get(const std::string& key) const override { return file_->get(key); }
  const std::vector<std::string>& keys() const override { return file_->keys(); }
  std::string describe() const override { return caller_ + ": '" + file_->path() + "'"; }

 private:
  std::shared_ptr<const NpzFile> file_;
  std::string caller_;
};

}  // namespace
}  // namespace detail

// --- DictionarySerializer
// ----------------------------------------------------------------------------

struct DictionarySerializer::Target {
  NamedArrays arrays;
  std::unordered_map<std::string, size_t> index;
};

DictionarySerializer::DictionarySerializer(std::string path)
    : target_(std::make_shared<Target>()), path_(normalize_path(path)) {}

DictionarySerializer::DictionarySerializer(std::shared_ptr<Target> target, std::string path)
    : target_(std::move(target)), path_(std::move(path)) {}

std::unique_ptr<Serializer> DictionarySerializer::child(const std::string& name) {
  return std::unique_ptr<Serializer>(
      new DictionarySerializer(target_, path_ + child_name(name) + "/"));
}

void DictionarySerializer::operator()(const std::string& key, Array& value) {
  const std::string full = path_ + strip_leading_slashes(key);
  KUSARI_CHECK(!strip_leading_slashes(key).empty(), ValueError,
               "DictionarySerializer: empty key under path '", path_, "'");
  if (!value.defined()) return;  // see Note [DictionarySerializer stores views]
  Array stored = value.device().is_cpu() ? value : value.to_device(Device::cpu());
  auto [it, inserted] = target_->index.emplace(full, target_->arrays.size());
  if (inserted) {
    target_->arrays.emplace_back(full, std::move(stored));
  } else {
    target_->arrays[it->second].second = std::move(stored);
  }
}

const NamedArrays& DictionarySerializer::target() const {
  return target_->arrays;
}

// --- NpzDeserializer
// -------------------------------------------------------------------------------

NpzDeserializer::NpzDeserializer(const NamedArrays& arrays, std::string path, bool strict,
                                 std::vector<std::string> ignore_names)
    : NpzDeserializer(std::make_shared<const detail::MemorySource>(arrays), std::move(path), strict,
                      std::move(ignore_names)) {}

NpzDeserializer::NpzDeserializer(std::shared_ptr<const NpzFile> file, std::string path, bool strict,
                                 std::vector<std::string> ignore_names)
    : NpzDeserializer(
          std::make_shared<const detail::FileSource>(std::move(file), "NpzDeserializer"),
          std::move(path), strict, std::move(ignore_names)) {}

NpzDeserializer::NpzDeserializer(std::shared_ptr<const detail::NpzSource> source, std::string path,
                                 bool strict, std::vector<std::string> ignore_names)
    : source_(std::move(source)), root_(normalize_path(path)), path_(root_), strict_(strict) {
  for (std::string& name : ignore_names) name = strip_leading_slashes(name);
  ignore_names_ = std::make_shared<const std::vector<std::string>>(std::move(ignore_names));
}

NpzDeserializer::NpzDeserializer(std::shared_ptr<const detail::NpzSource> source, std::string root,
                                 std::string path, bool strict,
                                 std::shared_ptr<const std::vector<std::string>> ignore_names)
    : source_(std::move(source)),
      root_(std::move(root)),
      path_(std::move(path)),
      strict_(strict),
      ignore_names_(std::move(ignore_names)) {}

NpzDeserializer::~NpzDeserializer() = default;

std::unique_ptr<Serializer> NpzDeserializer::child(const std::string& name) {
  return std::unique_ptr<Serializer>(
      new NpzDeserializer(source_, root_, path_ + child_name(name) + "/", strict_, ignore_names_));
}

bool NpzDeserializer::ignored(const std::string& full_key) const {
  return std::find(ignore_names_->begin(), ignore_names_->end(), full_key) != ignore_names_->end();
}

bool NpzDeserializer::contains(const std::string& key) const {
  const std::string full = path_ + strip_leading_slashes(key);
  return !ignored(full) && source_->contains(full);
}

void NpzDeserializer::missing(const std::string& full_key) const {
  // Suggest the path argument when the key exists under another prefix (e.g. loading a model
  // from a trainer snapshot without path = "updater/model:main/").
  const std::string relative = full_key.substr(root_.size());
  std::string hint;
  for (const std::string& k : source_->keys()) {
    if (k.size() > relative.size() && ends_with(k, "/" + relative)) {
      const std::string prefix = k.substr(0, k.size() - relative.size());
      hint = "; it has '" + k + "': pass path = \"" + prefix + "\" to load that sub-tree";
      break;
    }
    if (!root_.empty() && k == relative) {
      hint = "; it has '" + k + "': pass an empty path to load from the top";
      break;
    }
  }
  if (hint.empty() && source_->keys().empty()) hint = "; it holds no arrays";
  KUSARI_THROW(IOError, source_->describe(), " has no entry '", full_key, "'", hint,
               " (pass strict = false to leave missing values unchanged)");
}

void NpzDeserializer::operator()(const std::string& key, Array& value) {
  const std::string full = path_ + strip_leading_slashes(key);
  if (ignored(full)) return;
  if (!source_->contains(full)) {
    if (!strict_) return;
    missing(full);
  }
  Array stored = source_->get(full);
  if (!value.defined()) {
    value = std::move(stored);
    return;
  }
  KUSARI_CHECK(stored.shape() == value.shape(), ShapeError, source_->describe(), ": entry '", full,
               "' has shape ", stored.shape(), " (", dtype_name(stored.dtype()),
               ") but the value it is loaded into has shape ", value.shape(), " (",
               dtype_name(value.dtype()), ")");
  // In place, so that handles to the array (a parameter's data) see the new values.
  value.assign(stored.to_device(value.device()));
}

// --- save_npz / load_npz
// ---------------------------------------------------------------------------

void save_npz(const std::string& file, Serializable& obj, bool compression) {
  DictionarySerializer serializer;
  serializer.save(obj);
  detail::write_npz_impl(file, serializer.target(), compression, "save_npz");
}

void load_npz(const std::string& file, Serializable& obj, const std::string& path, bool strict,
              const std::vector<std::string>& ignore_names) {
  auto npz = std::make_shared<const NpzFile>(file, "load_npz");
  NpzDeserializer deserializer(
      std::make_shared<const detail::FileSource>(std::move(npz), "load_npz"), path, strict,
      ignore_names);
  deserializer.load(obj);
}

}  // namespace kusari
