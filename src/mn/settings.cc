// The check that every rank was started with the same settings (Note [Same settings]).
#include "kusari/mn/settings.h"

#include <algorithm>
#include <sstream>

#include "kusari/core/error.h"
#include "kusari/mn/object.h"
#include "mn/comm/op_tracker.h"
#include "mn/reduce/gradient_set.h"

namespace kusari::mn {

namespace {

// "rank 2", "ranks 0, 1 and 3".
std::string ranks_phrase(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out << (i + 1 == ranks.size() ? " and " : ", ");
    out << ranks[i];
  }
  return out.str();
}

}  // namespace

// Note [Same settings]
// Each process of a job parses its own command line. When the lines differ - an MPMD launch
// (`mpiexec -n 1 prog -b 50 : -n 1 prog -b 100`), a job script that computes a flag per node, a
// configuration file that differs between hosts - the ranks run different numbers of steps per
// epoch or of epochs, and one rank waits in a gradient allreduce that the other never joins: the
// job hangs with no output until it is killed. So the programs name, once at the start, every
// value that shapes the sequence of collectives, and the ranks compare them: one allreduce of a
// hash of the list (as check_same_parameters does for the model, Note [Same model]), and only
// when the hashes differ a gather of the lists, so that every rank raises the same error naming
// each setting that differs and its value on each rank. A setting that some rank lacks counts as
// "(not given)" there.
void check_same_settings(Communicator& comm, const std::vector<Setting>& settings,
                         const std::string& what) {
  detail::OpScope scope(detail::tracker_of(comm), detail::OpKind::kCollective, "check_same_settings");
  std::ostringstream sig;
  for (const auto& [name, value] : settings)
    sig << name.size() << ":" << name << "=" << value << "\n";
  if (detail::same_hash_everywhere(comm, detail::fnv1a(sig.str()))) return;

  ByteWriter w;
  w.put<uint64_t>(settings.size());
  for (const auto& [name, value] : settings) {
    w.put_string(name);
    w.put_string(value);
  }
  const std::vector<Bytes> all = comm.allgather_obj(w.take());
  std::vector<std::vector<Setting>> lists;
  std::vector<std::string> names;  // in the order of first appearance, rank 0's first
  for (const Bytes& b : all) {
    ByteReader r(b);
    std::vector<Setting> list(r.get<uint64_t>());
    for (Setting& s : list) {
      s.first = r.get_string();
      s.second = r.get_string();
      if (std::find(names.begin(), names.end(), s.first) == names.end()) names.push_back(s.first);
    }
    lists.push_back(std::move(list));
  }
  std::ostringstream differences, differing;
  int n_differing = 0;
  for (const std::string& name : names) {
    // The distinct values of `name`, in the order of the first rank that has each, with its ranks.
    std::vector<std::pair<std::string, std::vector<int>>> values;
    for (int rank = 0; rank < static_cast<int>(lists.size()); ++rank) {
      std::string value = "(not given)";
      for (const Setting& s : lists[static_cast<size_t>(rank)]) {
        if (s.first == name) {
          value = "'" + s.second + "'";
          break;
        }
      }
      auto it = std::find_if(values.begin(), values.end(),
                             [&](const auto& v) { return v.first == value; });
      if (it == values.end()) {
        values.push_back({value, {rank}});
      } else {
        it->second.push_back(rank);
      }
    }
    if (values.size() == 1) continue;
    differences << (n_differing ? "; " : "") << name << " is ";
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) differences << (i + 1 == values.size() ? " but " : ", ");
      differences << values[i].first << " on " << ranks_phrase(values[i].second);
    }
    differing << (n_differing ? ", " : "") << name;
    ++n_differing;
  }
  if (n_differing == 0) {
    // Same names and values, in another order.
    KUSARI_THROW(CommunicatorError, what,
                 ": the processes name their settings in different orders; ",
                 "every process must check the same settings in the same order");
  }
  KUSARI_THROW(
      CommunicatorError, what,
      ": the processes were started with different settings: ", differences.str(),
      "; every process must be started with the same ", differing.str(),
      " (the same command line), or they would run different collectives and wait for each other "
      "forever");
}

}  // namespace kusari::mn
