// Helpers shared by the trainer extensions: atomic file writes, terminal detection,
// Python-compatible number formatting, optional values in snapshots. Internal to kusari.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "kusari/serializers/serializer.h"

namespace kusari::training::detail {

/// Writes `data` to `path` atomically: a temporary file in the same folder is written, flushed
/// to disk and renamed over `path`, so a reader (or a crash) never sees a half-written file.
/// Creates the parent folder when missing. `fn` names the caller in errors (IOError).
void write_file_atomically(const std::string& path, std::string_view data, const char* fn);

/// Whether an extension writes for a terminal on `out`: `override_terminal` (the extension's
/// set_terminal) when set, else is_terminal_output(out) (Note [Terminal output]).
bool is_terminal(const std::ostream& out, std::optional<bool> override_terminal = std::nullopt);

/// printf("%g")-style text of `value`, which matches Python's "{:g}".
std::string format_g(double value, int precision = 6);

/// Python's str(datetime.timedelta(seconds=s)): "0:02:03.456000", "1 day, 2:03:04".
std::string format_timedelta(double seconds);

/// Saves `value` under `key` when it is set; loads it when the snapshot has `key` (an absent
/// key is Chainer's None: nothing was set yet).
void serialize_optional(Serializer& serializer, const std::string& key,
                        std::optional<double>& value);

}  // namespace kusari::training::detail
