// The check of a cuDNN variant pack against its graph, apart from cuDNN itself (tests call it on
// machines without the library).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kusari::cuda::cudnn_graph {

/// What is wrong with a variant pack of `count` unique ids for a graph whose non-virtual tensors
/// are `expected` (sorted): "" when the pack names each of them exactly once and nothing else,
/// else each repeated, extra and missing id ("uid 7 is missing", ...). cuDNN refuses a pack with
/// one id too many with a bare "bad parameter".
inline std::string variant_pack_mismatch(const std::vector<int64_t>& expected, const int64_t* uids,
                                         int64_t count) {
  std::vector<int64_t> given(uids, uids + std::max<int64_t>(count, 0));
  std::sort(given.begin(), given.end());
  std::string problems;
  const auto add = [&](int64_t uid, const char* what) {
    problems += (problems.empty() ? "uid " : "; uid ") + std::to_string(uid) + what;
  };
  for (size_t i = 1; i < given.size(); ++i) {
    if (given[i] == given[i - 1] && (i == 1 || given[i - 2] != given[i]))
      add(given[i], " is given more than once");
  }
  for (size_t i = 0; i < given.size(); ++i) {
    if ((i == 0 || given[i] != given[i - 1]) &&
        !std::binary_search(expected.begin(), expected.end(), given[i]))
      add(given[i], " is not a tensor of the graph (or a virtual one)");
  }
  for (int64_t uid : expected) {
    if (!std::binary_search(given.begin(), given.end(), uid)) add(uid, " is missing");
  }
  return problems;
}

}  // namespace kusari::cuda::cudnn_graph
