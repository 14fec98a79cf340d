// A loop of one communicator operation in which one rank, at one step, stops (SIGSTOP), sleeps
// without entering the operation, or finishes early (returns from main, or calls std::exit with
// its communicator still alive, so that only the end of MPI finishes it), while the others go on
// into the operation. Run by kusari_mn_job_check under mpiexec (see CMakeLists.txt): the job must
// end within a bounded time with a message naming the operation and that rank. With --how none
// every rank runs every step and the job must end cleanly.
//
//   kusari_mn_hung_rank --kind naive|flat|dummy --op OP --rank R --how stop|sleep|finish|exit|none
//                       [--at STEP] [--steps N]
// OP: mean_grad, barrier, bcast_obj, allreduce_obj, gather_obj, allgather_obj, bcast_data,
// send_recv (a ring of send_obj / recv_obj), split.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace mn = kusari::mn;

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "kusari_mn_hung_rank: %s\nusage: kusari_mn_hung_rank --kind K --op OP --rank R "
               "--how stop|sleep|finish|exit|none [--at STEP] [--steps N]\n",
               why);
  std::exit(2);
}

/// One step of `op` on `comm`.
void run_op(const std::string& op, mn::Communicator& comm, kusari::links::Linear& model,
            const kusari::Array& x) {
  const int rank = comm.rank(), size = comm.size();
  const mn::Bytes payload(16, static_cast<uint8_t>(rank));
  if (op == "mean_grad") {
    model.cleargrads();
    kusari::Variable loss = F::sum(F::square(model(x)));
    loss.backward();
    comm.multi_node_mean_grad(model, true);
  } else if (op == "barrier") {
    comm.barrier();
  } else if (op == "bcast_obj") {
    comm.bcast_obj(payload, 0);
  } else if (op == "allreduce_obj") {
    comm.allreduce_obj(1.0);
  } else if (op == "gather_obj") {
    comm.gather_obj(payload, 0);
  } else if (op == "allgather_obj") {
    comm.allgather_obj(payload);
  } else if (op == "bcast_data") {
    comm.bcast_data(model);
  } else if (op == "send_recv") {
    // A ring: even ranks send first, odd ranks receive first.
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (rank % 2 == 0) {
      comm.send_obj(payload, next, 5);
      comm.recv_obj(prev, 5);
    } else {
      comm.recv_obj(prev, 5);
      comm.send_obj(payload, next, 5);
    }
  } else if (op == "split") {
    comm.split(0, rank);
  } else {
    usage(("unknown --op " + op).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "naive", op = "barrier", how = "none";
  int target = 1, at = 3, steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--kind") kind = v;
    else if (a == "--op") op = v;
    else if (a == "--how") how = v;
    else if (a == "--rank") target = std::atoi(v.c_str());
    else if (a == "--at") at = std::atoi(v.c_str());
    else if (a == "--steps") steps = std::atoi(v.c_str());
    else usage(("unknown flag " + a).c_str());
  }
  if (how != "stop" && how != "sleep" && how != "finish" && how != "exit" && how != "none") usage("bad --how");

  auto comm = mn::create_communicator(kind);
  auto model = std::make_shared<kusari::links::Linear>(4, 2);
  const kusari::Array x = kusari::Array::uniform({8, 4});
  for (int step = 0; step < steps; ++step) {
    if (comm->rank() == target && step == at) {
      std::printf("rank %d: %s at step %d\n", target, how.c_str(), step);
      std::fflush(stdout);
      if (how == "stop") std::raise(SIGSTOP);
      if (how == "sleep") std::this_thread::sleep_for(std::chrono::hours(1));
      if (how == "finish") return 0;  // the communicator's destructor tells the others
      if (how == "exit") std::exit(0);  // no destructor: MPI_Finalize at exit tells them
    }
    run_op(op, *comm, *model, x);
  }
  std::printf("rank %d finished all %d steps\n", comm->rank(), steps);
  return 0;
}
