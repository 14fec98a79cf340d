#include "mn/comm/mpi_communicator.h"

#include <cstdlib>
#include <map>

#include "kusari/core/routines.h"
#include "mn/comm/mpi_util.h"
#include "mn/object_codec.h"

namespace kusari::mn::detail {

using ::kusari::detail::concat;

// Note [Topology]
// Ranks are grouped into hosts by processor name; hosts are ordered by their smallest rank and
// intra_rank is a rank's position among its host's ranks (ChainerMN's rule, so process i on a
// host drives GPU i). The intra-host communicator is split(color=inter_rank, key=intra_rank),
// the inter-host one split(color=intra_rank, key=inter_rank). KUSARI_MN_RANKS_PER_HOST=N makes
// pretend hosts of N consecutive ranks, so the hierarchical paths can be tested on one machine.
MpiCommunicator::MpiCommunicator(MPI_Comm comm, const CommunicatorOptions& options,
                                 const char* kind) {
  options_ = options;
  const char* dbg = std::getenv("KUSARI_MN_DEBUG");
  debug_ = options.debug || (dbg && std::string(dbg) == "1");
  if (const char* t = std::getenv("KUSARI_MN_TIMEOUT"))
    options_.timeout_seconds = parse_timeout_seconds(t, "KUSARI_MN_TIMEOUT");
  KUSARI_CHECK(options_.timeout_seconds >= 0, ValueError,
               "create_communicator: timeout_seconds must be 0 (no deadline) or more, got ",
               options_.timeout_seconds);
  if (const char* g = std::getenv("KUSARI_MN_GRADIENTS_IN_BUFFER")) {
    const std::string v = g;
    const bool on = v == "1" || v == "on" || v == "true";
    KUSARI_CHECK(on || v == "0" || v == "off" || v == "false", ValueError,
                 "KUSARI_MN_GRADIENTS_IN_BUFFER must be 1 (on) or 0 (off), got '", v, "'");
    options_.gradients_in_buffer = on;
  }
  std::string host;
  if (const char* per = std::getenv("KUSARI_MN_RANKS_PER_HOST")) {
    const int n = std::atoi(per);
    KUSARI_CHECK(n > 0, ValueError, "KUSARI_MN_RANKS_PER_HOST must be a positive integer, got '", per, "'");
  }
  MPI_Request request;
  KUSARI_MPI_CHECK(MPI_Comm_idup(comm, &comm_, &request));
  wait_untracked(&request, 1, concat(kind, ": creating the communicator (MPI_Comm_idup)").c_str(),
                 options_.timeout_seconds);
  try {
    KUSARI_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    KUSARI_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    KUSARI_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    tracker_ = OpTracker::create(comm_, kind, options_.timeout_seconds, options_.check_collectives);
    OpScope scope(tracker_.get(), OpKind::kCollective, "create_communicator");

    if (const char* per = std::getenv("KUSARI_MN_RANKS_PER_HOST")) {
      host = "pretend-host-" + std::to_string(rank_ / std::atoi(per));
    } else {
      char name[MPI_MAX_PROCESSOR_NAME];
      int len = 0;
      KUSARI_MPI_CHECK(MPI_Get_processor_name(name, &len));
      host.assign(name, static_cast<size_t>(len));
    }
    Writer w;
    w.put_string(host);
    std::vector<Bytes> all = allgather_obj(w.take());
    std::vector<std::string> hosts;
    for (const Bytes& b : all) hosts.push_back(Reader(b).get_string());
    std::map<std::string, int> host_index;
    std::map<std::string, int> host_count;
    for (int r = 0; r < size_; ++r) {
      if (!host_index.count(hosts[static_cast<size_t>(r)])) {
        const int next = static_cast<int>(host_index.size());
        host_index[hosts[static_cast<size_t>(r)]] = next;
      }
      if (r == rank_) intra_rank_ = host_count[hosts[static_cast<size_t>(r)]];
      ++host_count[hosts[static_cast<size_t>(r)]];
    }
    inter_rank_ = host_index[host];
    inter_size_ = static_cast<int>(host_index.size());
    intra_size_ = host_count[host];
    // MPI_Comm_split has no non-blocking form (Note [Blocking calls]).
    BlockingCallWatch watch(options_.timeout_seconds,
                            tracker_->blocking_call_message("MPI_Comm_split"));
    KUSARI_MPI_CHECK(MPI_Comm_split(comm_, inter_rank_, intra_rank_, &intra_comm_));
    KUSARI_MPI_CHECK(MPI_Comm_split(comm_, intra_rank_, inter_rank_, &inter_comm_));
  } catch (...) {
    release_mpi();
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() { finalize(); }

intptr_t MpiCommunicator::mpi_comm_handle() const {
  KUSARI_CHECK(comm_ != MPI_COMM_NULL, CommunicatorError, name(), ": the communicator was finalized");
  return from_comm(comm_);
}

void MpiCommunicator::finalize() { release_mpi(); }

void MpiCommunicator::release_mpi() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const bool broken = tracker_ && tracker_->broken();
  if (tracker_) {
    tracker_->finish();  // tells the other ranks (Note [A rank that finishes early])
    tracker_.reset();
  }
  for (MPI_Comm* c : {&intra_comm_, &inter_comm_, &comm_}) {
    if (*c != MPI_COMM_NULL && !broken) MPI_Comm_free(c);
    *c = MPI_COMM_NULL;
  }
}

// --- the kinds: naive, flat, dummy -----------------------------------------------------------

namespace {

HostStrategy strategy_of(const char* name) {
  const std::string n = name;
  if (n == "naive") return HostStrategy::kPerParameter;
  if (n == "flat") return HostStrategy::kOneBuffer;
  KUSARI_CHECK(n == "dummy", ValueError, "HostCommunicator: unknown kind '", n, "'");
  return HostStrategy::kMoveOnly;
}

}  // namespace

HostCommunicator::HostCommunicator(MPI_Comm comm, const CommunicatorOptions& options,
                                   const char* name)
    : MpiCommunicator(comm, options, name), name_(name), reducer_(*this, strategy_of(name)) {}

void HostCommunicator::multi_node_mean_grad(Link& model, bool zero_fill) {
  OpScope scope(tracker(), OpKind::kCollective, "multi_node_mean_grad");
  reducer_.mean_grad(model, zero_fill);
}

HostCommunicator::~HostCommunicator() { reducer_.release(); }

void HostCommunicator::finalize() {
  reducer_.release();
  MpiCommunicator::finalize();
}

std::shared_ptr<Communicator> HostCommunicator::split(int color, int key) {
  OpTracker* t = tracker();
  KUSARI_CHECK(t != nullptr, CommunicatorError, name_, ": split: the communicator was finalized");
  OpScope scope(t, OpKind::kCollective, "split");
  MPI_Comm sub;
  {
    BlockingCallWatch watch(options().timeout_seconds, t->blocking_call_message("MPI_Comm_split"));
    KUSARI_MPI_CHECK(MPI_Comm_split(comm(), color, key, &sub));
  }
  auto c = std::make_shared<HostCommunicator>(sub, options(), name_);
  MPI_Comm_free(&sub);  // the new communicator holds its own duplicate
  return c;
}

}  // namespace kusari::mn::detail
