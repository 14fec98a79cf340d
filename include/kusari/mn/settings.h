// The check that every process of a job was started with the same settings: a batch size, a
// number of epochs or a snapshot interval that differs between ranks makes them run different
// sequences of collectives, and the job hangs instead of failing.
//
//   kusari::mn::check_same_settings(*comm, {{"--batchsize", std::to_string(batchsize)},
//                                           {"--epoch", std::to_string(epoch)}}, "train_mnist");
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// A named value that every process must have alike: {"--batchsize", "100"}.
using Setting = std::pair<std::string, std::string>;

/// Checks that every rank passes the same settings, names and values in the same order
/// (collective: every rank calls it at the same point). One allreduce of a hash when they agree;
/// otherwise every rank gathers the lists and raises the same CommunicatorError, naming each
/// setting that differs and its value on each rank, e.g. "train_mnist: the processes were
/// started with different settings: --batchsize is '50' on rank 0 but '100' on rank 1; every
/// process must be started with the same --batchsize (the same command line), ...". A setting
/// that a rank does not pass is "(not given)" there. `what` names the program or the call
/// (Note [Same settings]).
void check_same_settings(Communicator& comm, const std::vector<Setting>& settings,
                         const std::string& what);
/// check_same_settings with the communicator as create_communicator returns it.
inline void check_same_settings(const std::shared_ptr<Communicator>& comm, const std::vector<Setting>& settings,
                                const std::string& what) {
  check_same_settings(detail::communicator_of(comm, "check_same_settings"), settings, what);
}

}  // namespace kusari::mn
