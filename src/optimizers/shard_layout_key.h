// The key a sharded optimizer (kusari::mn, Note [Sharded snapshot files]) writes beside its
// pieces of the state, under the optimizer's path: Optimizer::serialize refuses a snapshot that
// holds it (one process's part), and kusari::mn reads the layout from it.
#pragma once

namespace kusari::optimizers::detail {

inline constexpr const char* kShardLayoutKey = "mn_shard_layout";

}  // namespace kusari::optimizers::detail
