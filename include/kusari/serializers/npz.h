// NumPy .npy / .npz files and the npz serializers (Chainer's chainer.serializers.npz).
//
//   kusari::save_npz("model.npz", *model);                  // "l1/W", "l1/b", ...
//   kusari::load_npz("model.npz", *fresh_model);
//   kusari::load_npz("snapshot_iter_1000", *model, "updater/model:main/");   // from a trainer
//   snapshot
//
// The files are ordinary ZIP archives of .npy members, so `numpy.load("model.npz")` reads them
// and Chainer's `serializers.load_npz` loads them into the matching Chainer model (and the other
// way round). See docs/serialization.md.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/serializers/serializer.h"

namespace kusari {

/// Arrays with their names, in order (the keys of an npz file without the ".npy" suffix).
using NamedArrays = std::vector<std::pair<std::string, Array>>;

// --- files --------------------------------------------------------------------------------------

/// Reads every array of an npz file (numpy.load(path) of an archive), on the CPU, in archive
/// order. Throws IOError naming the file and the problem when it is missing, truncated or corrupt
/// or holds a dtype kusari cannot represent. See Note [NPY dtypes] for the dtype mapping.
NamedArrays read_npz(const std::string& path);

/// Writes arrays (any device, layout and dtype; bfloat16 is stored as float32) as an npz file,
/// deflate-compressed unless `compress` is false (numpy.savez_compressed / numpy.savez). Keys must
/// be unique and non-empty. The file is replaced atomically: on any error the previous file is
/// left as it was and no temporary file remains (Note [Atomic file replacement]); a successful
/// write also removes the temporary files that killed writes of `path` left behind (Note [Stale
/// temporary files]).
void write_npz(const std::string& path, const NamedArrays& arrays, bool compress = true);

/// Removes from `dir` the temporary files that interrupted writes left behind (a save_npz,
/// write_npz or write_npy killed before it renamed its file into place): files named
/// ".<target>.tmp.XXXXXX" whose <target> `owns` accepts, last modified before `modified_before`,
/// that no running write holds (Note [Stale temporary files]). Returns the names removed. Best
/// effort: a file that cannot be removed stays where it is, silently. Every successful write
/// already does this for its own target, and the snapshot extension and the multi-node
/// checkpointer for their file name patterns; call it for names of your own, e.g.
/// `remove_stale_temporary_files("out", [](const std::string& t) { return t.starts_with("model_"); })`.
std::vector<std::string> remove_stale_temporary_files(
    const std::string& dir, const std::function<bool(const std::string& target)>& owns,
    std::filesystem::file_time_type modified_before = std::filesystem::file_time_type::clock::now());

/// Reads one .npy file (numpy.load of a .npy), on the CPU.
Array read_npy(const std::string& path);

/// Writes one array as a .npy file (numpy.save), atomically.
void write_npy(const std::string& path, const Array& array);

/// An open npz file whose members are decoded when asked for (like numpy.load's NpzFile), so
/// that loading a sub-tree of a large snapshot reads only that part.
class NpzFile {
 public:
  /// Opens `path` and reads its directory; `caller` names the function in error messages.
  explicit NpzFile(const std::string& path, std::string caller = "NpzFile");
  ~NpzFile();
  NpzFile(const NpzFile&) = delete;
  NpzFile& operator=(const NpzFile&) = delete;

  /// The file name given to the constructor.
  const std::string& path() const;
  /// The array names, in archive order (members not ending in ".npy" are not listed).
  const std::vector<std::string>& keys() const;
  /// True when the archive has an array named `key`.
  bool contains(const std::string& key) const;
  /// Decodes the array `key` (a new CPU array); throws IOError when it is missing or corrupt.
  Array get(const std::string& key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- serializers ---------------------------------------------------------------------------------

namespace detail {
struct NpzSource;
}  // namespace detail

/// Collects the arrays of a Serializable under their full keys ("l1/W", "updater/iteration", ...)
/// for writing with write_npz (Chainer's DictionarySerializer).
///
/// Note [DictionarySerializer stores views]
/// Like Chainer's, which stores the NumPy arrays themselves, the target holds CPU arrays as
/// views of the serialized values (no copy; write it out before changing them); arrays on a GPU
/// are copied to the host. An undefined array (a lazily sized parameter that was never
/// initialised) is not stored: Chainer stores None there, which NumPy can only read back with
/// pickle enabled, and loading leaves such a value undefined either way (use strict = false when
/// loading into a model whose parameters are initialised).
class DictionarySerializer : public Serializer {
 public:
  /// An empty target; `path` is prepended to every key (normally empty).
  explicit DictionarySerializer(std::string path = "");

  /// False: this serializer saves.
  bool is_loading() const override { return false; }
  /// The serializer for path() + name + "/", sharing this one's target.
  std::unique_ptr<Serializer> child(const std::string& name) override;
  /// Stores `value` under path() + key; a second value under the same key replaces the first.
  void operator()(const std::string& key, Array& value) override;
  using Serializer::operator();
  /// True: when saving every key may be written.
  bool contains(const std::string& key) const override { return true; }
  /// The prefix of this serializer's keys, e.g. "updater/model:main/".
  std::string path() const override { return path_; }

  /// Serializes `obj` into the target (Chainer's DictionarySerializer.save).
  void save(Serializable& obj) { obj.serialize(*this); }
  /// The collected arrays in the order they were stored (shared with this serializer's children).
  const NamedArrays& target() const;

 private:
  struct Target;
  DictionarySerializer(std::shared_ptr<Target> target, std::string path);

  std::shared_ptr<Target> target_;
  std::string path_;
};

/// Loads values into a Serializable from named arrays (Chainer's NpzDeserializer). The key of a
/// value is path + key, e.g. "updater/model:main/" + "l1/W".
///
/// Loading into a defined array copies in place (shapes must match, else ShapeError naming the
/// key; the dtype is converted; the array keeps its device). Into an undefined array the stored
/// array is taken as is, on the CPU. A missing key raises IOError naming the full key when
/// `strict`, else leaves the value unchanged; keys listed in `ignore_names` (full keys) are
/// always left unchanged.
class NpzDeserializer : public Serializer {
 public:
  /// Reads from arrays held in memory (e.g. the result of read_npz).
  explicit NpzDeserializer(const NamedArrays& arrays, std::string path = "", bool strict = true,
                           std::vector<std::string> ignore_names = {});
  /// Reads from an open npz file, decoding only the arrays that are asked for.
  explicit NpzDeserializer(std::shared_ptr<const NpzFile> file, std::string path = "",
                           bool strict = true, std::vector<std::string> ignore_names = {});
  /// Reads from any source of arrays (used by load_npz; detail::NpzSource is internal).
  NpzDeserializer(std::shared_ptr<const detail::NpzSource> source, std::string path, bool strict,
                  std::vector<std::string> ignore_names);
  ~NpzDeserializer() override;

  /// True: this serializer loads.
  bool is_loading() const override { return true; }
  /// The deserializer for path() + name + "/" (same source, strictness and ignore_names).
  std::unique_ptr<Serializer> child(const std::string& name) override;
  /// Loads path() + key into `value` as described above.
  void operator()(const std::string& key, Array& value) override;
  using Serializer::operator();
  /// True when path() + key is stored (and not ignored).
  bool contains(const std::string& key) const override;
  /// The prefix of this deserializer's keys, e.g. "updater/model:main/l1/".
  std::string path() const override { return path_; }

  /// Loads `obj` (Chainer's NpzDeserializer.load).
  void load(Serializable& obj) { obj.serialize(*this); }

 private:
  NpzDeserializer(std::shared_ptr<const detail::NpzSource> source, std::string root,
                  std::string path, bool strict,
                  std::shared_ptr<const std::vector<std::string>> ignore_names);
  bool ignored(const std::string& full_key) const;
  [[noreturn]] void missing(const std::string& full_key) const;

  std::shared_ptr<const detail::NpzSource> source_;
  std::string root_;  // the path given to the top-level deserializer (for error hints)
  std::string path_;
  bool strict_;
  std::shared_ptr<const std::vector<std::string>> ignore_names_;
};

/// Saves `obj` (a Link, Optimizer, Trainer, ...) to an npz file in Chainer's key layout,
/// compressed unless `compression` is false. The file is replaced atomically, and the temporary
/// files that killed saves of `file` left behind are removed (Note [Stale temporary files]).
void save_npz(const std::string& file, Serializable& obj, bool compression = true);

/// Loads `obj` from an npz file written by save_npz (or by Chainer). `path` selects a sub-tree,
/// e.g. "updater/model:main/" to load a model out of a trainer snapshot; `strict` and
/// `ignore_names` are as in NpzDeserializer.
void load_npz(const std::string& file, Serializable& obj, const std::string& path = "",
              bool strict = true, const std::vector<std::string>& ignore_names = {});

}  // namespace kusari
