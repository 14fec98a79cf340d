// The multi-host check: run under mpiexec, once with every rank on one host and once across
// pretend hosts (network namespaces linked by TCP, scripts/pretend_hosts.sh), it checks the
// topology against the expected layout and writes, on rank 0, every result that must not depend
// on where the ranks run: the mean gradients of every CPU communicator, bcast_data, the array and
// object collectives, scatter_dataset, multi-node batch normalization, the multi-node optimizer
// and evaluator. multi_host_tcp.sh compares the two files byte for byte.
//
//   multi_host_check --hosts 2,2 --out result.txt     (2 hosts: ranks 0-1 and 2-3)
//
// A failed check throws; the uncaught exception ends the whole job with its message.
#include <mpi.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kusari/datasets/image.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace {

using namespace kusari;
namespace F = kusari::functions;
using mn::Bytes;
using mn::Communicator;
using mn::ReduceOp;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("multi_host_check: " + what);
}

/// FNV-1a over bytes: equal bits give equal hashes, and a changed bit almost surely changes it.
uint64_t fnv(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string digest(const Array& a) {
  Array c = a.to_device(Device::cpu()).contiguous();
  char buf[96];
  const double total = c.size() == 0 ? 0.0 : kusari::sum(c.astype(float64)).item<double>();
  std::snprintf(buf, sizeof buf, "%s%s hash=%016" PRIx64 " sum=%.9g", c.shape().to_string().c_str(),
                dtype_name(c.dtype()), fnv(c.raw_data(), static_cast<size_t>(c.nbytes())), total);
  return buf;
}

std::string digest(const Bytes& b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes hash=%016" PRIx64, b.size(), fnv(b.data(), b.size()));
  return buf;
}

Bytes pattern(size_t n, uint64_t seed) {
  Bytes b(n);
  uint64_t x = seed * 2654435761ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b[i] = static_cast<uint8_t>(x >> 56);
  }
  return b;
}

/// Lines that rank 0 writes; the other ranks' results reach it through gathers.
class Report {
 public:
  explicit Report(Communicator& comm) : comm_(comm) {}
  /// Every rank calls it; rank 0 writes one line per rank ("<key> rank <r>: <value>").
  void per_rank(const std::string& key, const std::string& value) {
    std::vector<Bytes> all = comm_.gather_obj(Bytes(value.begin(), value.end()), 0);
    for (size_t r = 0; r < all.size(); ++r) {
      text_ << key << " rank " << r << ": " << std::string(all[r].begin(), all[r].end()) << "\n";
    }
  }
  /// Every rank calls it with the value that must be the same everywhere; rank 0 writes it once.
  void same(const std::string& key, const std::string& value) {
    std::vector<Bytes> all = comm_.allgather_obj(Bytes(value.begin(), value.end()));
    for (size_t r = 0; r < all.size(); ++r) {
      check(std::string(all[r].begin(), all[r].end()) == value,
            key + ": rank " + std::to_string(r) + " has '" + std::string(all[r].begin(), all[r].end()) +
                "' but rank " + std::to_string(comm_.rank()) + " has '" + value + "'");
    }
    text_ << key << ": " << value << "\n";
  }
  /// Rank 0's value (e.g. what a gather brought it); no communication.
  void root(const std::string& key, const std::string& value) {
    if (comm_.rank() == 0) text_ << key << ": " << value << "\n";
  }
  std::string text() const { return text_.str(); }

 private:
  Communicator& comm_;
  std::ostringstream text_;
};

// --- topology ---------------------------------------------------------------------------------

/// Checks rank, intra/inter ranks and sizes against `hosts` (ranks per host, hosts filled in
/// rank order as mpiexec's default mapping does), and that the processor names group the ranks
/// the same way. Also checks the hierarchical sub-communicators a two-level reduction uses.
void check_topology(Communicator& comm, const std::vector<int>& hosts) {
  int total = 0;
  for (int n : hosts) total += n;
  check(comm.size() == total, "the job has " + std::to_string(comm.size()) + " ranks but --hosts adds up to " +
                                  std::to_string(total));
  const int r = comm.rank();
  int host = 0, first = 0;
  while (r >= first + hosts[static_cast<size_t>(host)]) first += hosts[static_cast<size_t>(host++)];
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::ostringstream mine;
  mine << "host " << std::string(name, static_cast<size_t>(len)) << " intra " << comm.intra_rank() << "/"
       << comm.intra_size() << " inter " << comm.inter_rank() << "/" << comm.inter_size();
  std::printf("multi_host_check: rank %d of %d: %s\n", r, comm.size(), mine.str().c_str());
  std::fflush(stdout);
  const std::string where = "rank " + std::to_string(r) + " (" + mine.str() + ")";
  check(comm.inter_size() == static_cast<int>(hosts.size()),
        where + ": inter_size should be the number of hosts, " + std::to_string(hosts.size()));
  check(comm.inter_rank() == host, where + ": inter_rank should be " + std::to_string(host));
  check(comm.intra_size() == hosts[static_cast<size_t>(host)],
        where + ": intra_size should be " + std::to_string(hosts[static_cast<size_t>(host)]));
  check(comm.intra_rank() == r - first, where + ": intra_rank should be " + std::to_string(r - first));

  // The processor names: one per host, shared by its ranks.
  std::vector<std::string> names;
  for (const Bytes& b : comm.allgather_obj(Bytes(name, name + len))) names.emplace_back(b.begin(), b.end());
  const std::set<std::string> distinct(names.begin(), names.end());
  check(distinct.size() == hosts.size(), where + ": the ranks report " + std::to_string(distinct.size()) +
                                             " processor names, expected one per host (" +
                                             std::to_string(hosts.size()) + ")");
  for (int q = 0; q < comm.size(); ++q) {
    const bool same_host = q >= first && q < first + hosts[static_cast<size_t>(host)];
    check((names[static_cast<size_t>(q)] == names[static_cast<size_t>(r)]) == same_host,
          where + ": rank " + std::to_string(q) + (same_host ? " should" : " should not") +
              " have the same processor name");
  }

  // The hierarchical split (Note [Topology]) and a two-level sum through it: within each host,
  // then across hosts among the ranks of the same intra_rank, then back within the host.
  auto intra = comm.split(comm.inter_rank(), comm.intra_rank());
  auto inter = comm.split(comm.intra_rank(), comm.inter_rank());
  check(intra->size() == comm.intra_size() && intra->rank() == comm.intra_rank(),
        where + ": the intra-host communicator has rank " + std::to_string(intra->rank()) + " of " +
            std::to_string(intra->size()));
  // The inter-host communicator holds one rank of each host with a rank at this intra_rank (all
  // hosts when they are even), in host order.
  int same_position = 0, before = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (hosts[h] <= comm.intra_rank()) continue;
    ++same_position;
    if (static_cast<int>(h) < host) ++before;
  }
  check(inter->size() == same_position && inter->rank() == before,
        where + ": the inter-host communicator has rank " + std::to_string(inter->rank()) + " of " +
            std::to_string(inter->size()) + ", expected " + std::to_string(before) + " of " +
            std::to_string(same_position));
  Array x = Array::arange(0.0, 1000.0, 1.0, float64) * static_cast<double>(r + 1);
  Array host_sum = intra->allreduce(x);
  Array world = intra->bcast(comm.intra_rank() == 0 ? inter->allreduce(host_sum) : host_sum, 0);
  check(array_equal(world, comm.allreduce(x)),
        where + ": the sum within hosts, then across hosts, differs from the sum over the world");
  double host_total = intra->allreduce_obj(static_cast<double>(r), ReduceOp::kSum);
  double expected_host_total = 0;
  for (int q = first; q < first + hosts[static_cast<size_t>(host)]; ++q) expected_host_total += q;
  check(host_total == expected_host_total, where + ": the ranks of its host add up to " +
                                               std::to_string(host_total) + ", expected " +
                                               std::to_string(expected_host_total));
}

// --- gradients --------------------------------------------------------------------------------

/// A model with a parameter large enough to need many TCP segments (1 MiB), of float32 only (so
/// "flat" can keep the gradients in its buffer) or also of float64 and float16.
std::shared_ptr<Link> make_model(bool mixed) {
  auto m = std::make_shared<Link>();
  m->add_param("a", Parameter(Array::zeros({300, 200}, float32)));
  m->add_param("big", Parameter(Array::zeros({1 << 18}, float32)));
  m->add_param("c", Parameter(Array::zeros({7}, float32)));
  if (mixed) {
    m->add_param("d", Parameter(Array::zeros({5, 3}, float64)));
    m->add_param("e", Parameter(Array::zeros({33}, float16)));
  }
  return m;
}

/// Rank r's gradients (a different draw per rank); "/c" has none on odd ranks unless `all`.
void set_gradients(Link& model, int rank, bool all) {
  Generator g(1000 + static_cast<uint64_t>(rank));
  for (auto& [path, p] : model.namedparams()) {
    if (path == "/c" && rank % 2 == 1 && !all) continue;
    p.set_grad(Array::normal(p.shape(), 0.0, 1.0, float32, Device::cpu(), &g).astype(p.dtype()));
  }
}

void mean_grads(Report& report, const std::string& kind, const mn::CommunicatorOptions& options,
                const std::string& label, bool mixed) {
  auto comm = mn::create_communicator(kind, options);
  for (bool zero_fill : {true, false}) {
    auto model = make_model(mixed);
    set_gradients(*model, comm->rank(), /*all=*/!zero_fill);
    comm->multi_node_mean_grad(*model, zero_fill);
    for (auto& [path, p] : model->namedparams()) {
      const std::string key = "mean_grad " + label + (zero_fill ? " zero_fill " : " ") + path;
      // "dummy" packs and unpacks only: each rank keeps its own gradients.
      if (kind == "dummy") report.per_rank(key, p.grad().defined() ? digest(p.grad()) : "(none)");
      else report.same(key, digest(p.grad()));
    }
  }
  // The same reduction over each host's ranks (a split keeps the kind): the mean of the host's
  // draws, which every rank can compute itself.
  auto intra = comm->split(comm->inter_rank(), comm->intra_rank());
  auto model = make_model(mixed);
  set_gradients(*model, comm->rank(), true);
  intra->multi_node_mean_grad(*model);
  if (kind == "dummy") return;
  const int first = comm->rank() - comm->intra_rank();
  std::map<std::string, Array> expected;
  for (int q = first; q < first + comm->intra_size(); ++q) {
    auto other = make_model(mixed);
    set_gradients(*other, q, true);
    for (auto& [path, p] : other->namedparams()) {
      Array g = p.grad().astype(float64);
      auto it = expected.find(path);
      if (it == expected.end()) expected.emplace(path, g);
      else it->second = it->second + g;
    }
  }
  for (auto& [path, p] : model->namedparams()) {
    const double tolerance = p.dtype() == float16 ? 2e-3 : 1e-6;
    check(allclose(p.grad().astype(float64), expected.at(path) * (1.0 / comm->intra_size()), tolerance, tolerance),
          kind + ": the mean gradient over host " + std::to_string(comm->inter_rank()) + "'s ranks of " + path +
              " differs from the mean of their draws");
  }
}

// --- the rest of the data-parallel pieces ------------------------------------------------------

void broadcast_and_collectives(Report& report) {
  auto comm = mn::create_communicator("flat");
  const int r = comm->rank(), s = comm->size();

  manual_seed(50 + static_cast<uint64_t>(r));  // a different model on every rank
  auto mlp = std::make_shared<Sequential>();
  mlp->add(std::make_shared<links::Linear>(20, 64)).add(F::relu).add(std::make_shared<links::Linear>(64, 5));
  comm->bcast_data(*mlp);
  for (auto& [path, p] : mlp->namedparams()) report.same("bcast_data " + path, digest(p.data()));

  Generator g(7 + static_cast<uint64_t>(r));
  Array mine = Array::normal({3, 4}, 0, 1, float32, Device::cpu(), &g);
  report.same("bcast from last rank", digest(comm->bcast(mine, s - 1)));
  std::string gathered;
  for (const Array& a : comm->gather(mine, 0)) gathered += digest(a) + "; ";
  report.root("gather at 0", gathered);
  std::vector<Array> everyone = comm->allgather(mine);
  std::string all_digests;
  for (const Array& a : everyone) all_digests += digest(a) + "; ";
  report.same("allgather", all_digests);
  std::vector<Array> outgoing;
  for (int q = 0; q < s; ++q) outgoing.push_back(Array::full({2, static_cast<int64_t>(q) + 1}, 10.0 * r + q, float32));
  std::string incoming;
  for (const Array& a : comm->alltoall(outgoing)) incoming += digest(a) + "; ";
  report.per_rank("alltoall", incoming);
  std::vector<Array> pieces;
  for (int q = 0; q < s; ++q) pieces.push_back(Array::full({q + 2}, 100.0 + q, float64));
  report.per_rank("scatter from 0", digest(comm->scatter(r == 0 ? pieces : std::vector<Array>{}, 0)));
  for (auto [op, name] : {std::pair{ReduceOp::kSum, "sum"}, {ReduceOp::kMax, "max"}, {ReduceOp::kMin, "min"},
                          {ReduceOp::kMean, "mean"}}) {
    report.same(std::string("allreduce ") + name, digest(comm->allreduce(mine, op)));
  }

  // Objects: a 3 MiB broadcast, gathers, reductions and a ring of 1 MiB messages.
  Bytes big = comm->bcast_obj(r == s - 1 ? pattern(3u << 20, 99) : Bytes{}, s - 1);
  check(big == pattern(3u << 20, 99), "bcast_obj: rank " + std::to_string(r) + " received other bytes");
  report.same("bcast_obj", digest(big));
  const std::string word = "rank " + std::to_string(r) + std::string(static_cast<size_t>(r) * 1000, '.');
  std::vector<Bytes> words = comm->gather_obj(Bytes(word.begin(), word.end()), 0);
  std::string gathered_words;
  for (const Bytes& b : words) gathered_words += digest(b) + "; ";
  report.root("gather_obj at 0", gathered_words);
  std::string allgathered;
  for (const Bytes& b : comm->allgather_obj(pattern(1000u + static_cast<size_t>(r), static_cast<uint64_t>(r)))) {
    allgathered += digest(b) + "; ";
  }
  report.same("allgather_obj", allgathered);
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, "%.17g %" PRId64 " %.17g", comm->allreduce_obj(r + 0.25, ReduceOp::kSum),
                comm->allreduce_obj(static_cast<int64_t>(r) * 7, ReduceOp::kMax),
                comm->allreduce_obj(std::vector<double>{1.0 * r, -2.0 * r, 0.5}, ReduceOp::kMean)[1]);
  report.same("allreduce_obj", numbers);
  const int next = (r + 1) % s, prev = (r + s - 1) % s;
  Bytes received;
  if (r == 0) {  // the ring starts at rank 0 (every other rank receives before it sends)
    comm->send_obj(pattern(1u << 20, static_cast<uint64_t>(r)), next, 5);
    received = comm->recv_obj(prev, 5);
  } else {
    received = comm->recv_obj(prev, 5);
    comm->send_obj(pattern(1u << 20, static_cast<uint64_t>(r)), next, 5);
  }
  check(received == pattern(1u << 20, static_cast<uint64_t>(prev)),
        "send_obj/recv_obj: rank " + std::to_string(r) + " received other bytes from rank " + std::to_string(prev));
  report.per_rank("recv_obj from previous", digest(received));
}

void datasets_and_evaluation(Report& report) {
  auto comm = mn::create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  const int64_t n = 23;
  Generator g(5);
  Array x = Array::normal({n, 6}, 0, 1, float32, Device::cpu(), &g);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(i % 3));
  auto data = std::make_shared<TupleDataset>(std::vector<Array>{x, Array::from_vector(labels)});

  for (int root : {0, s - 1}) {
    for (bool shuffle : {false, true}) {
      for (bool equal : {true, false}) {
        // The root alone holds the data on the second pass: it sends every rank its examples.
        for (bool only_root : {false, true}) {
          auto given = only_root && r != root ? nullptr : std::static_pointer_cast<Dataset>(data);
          auto part = mn::scatter_dataset(given, *comm, root, shuffle, 11, equal);
          std::string rows;
          for (int64_t i = 0; i < part->size(); ++i) rows += digest(part->get_example(i)[0]) + ",";
          std::ostringstream key;
          key << "scatter_dataset root " << root << " shuffle " << shuffle << " equal " << equal << " only_root "
              << only_root;
          report.per_rank(key.str(), std::to_string(part->size()) + " examples " + digest(Bytes(rows.begin(), rows.end())));
        }
      }
    }
  }

  // Multi-node batch normalization over unequal batches (rank q holds q + 2 samples).
  {
    Generator bg(21 + static_cast<uint64_t>(r));
    Array xb = Array::normal({r + 2, 3, 2, 2}, 0.5, 2.0, float64, Device::cpu(), &bg);
    Array wb = Array::normal({r + 2, 3, 2, 2}, 0, 1, float64, Device::cpu(), &bg);
    mn::MultiNodeBatchNormalization bn(3, comm, 0.9, 2e-5, float64);
    Variable xv(xb, true);
    Variable y = bn(xv);
    F::sum(y * Variable(wb)).backward();
    report.per_rank("batch_normalization y", digest(y.data()));
    report.per_rank("batch_normalization gx", digest(xv.grad()));
    report.per_rank("batch_normalization ggamma", digest(bn.gamma.grad()));
    report.same("batch_normalization avg_var", digest(bn.persistent("avg_var")));
  }

  // The multi-node optimizer: a few steps of momentum SGD on each rank's own batch.
  for (const char* kind : {"naive", "flat"}) {
    auto opt_comm = mn::create_communicator(kind);
    manual_seed(300 + static_cast<uint64_t>(r));
    auto model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(6, 3));
    auto opt = mn::create_multi_node_optimizer(std::make_shared<optimizers::MomentumSGD>(0.05), opt_comm);
    opt->setup(model);
    auto part = mn::scatter_dataset(data, *opt_comm, 0, true, 17);
    for (int step = 0; step < 4; ++step) {
      const int64_t i = step % part->size();
      std::vector<Array> ex = part->get_example(i);
      opt->update([&] { return (*model)(Variable(ex[0].reshape({1, 6})), ex[1].reshape({1})); });
    }
    for (auto& [path, p] : model->namedparams()) report.same(std::string("multi_node_optimizer ") + kind + " " + path, digest(p.data()));
  }

  // The multi-node evaluator: each rank evaluates its shard; the result is the whole set's.
  manual_seed(400);
  auto classifier = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(6, 3));
  comm->bcast_data(*classifier);
  auto shard = mn::scatter_dataset(data, *comm, 0, true, 3, /*force_equal_length=*/false);
  auto evaluator = mn::create_multi_node_evaluator(
      training::extensions::Evaluator(std::make_shared<SerialIterator>(shard, 4, false, false), classifier), comm);
  evaluator->set_name("validation");
  std::map<std::string, double> got = evaluator->evaluate();
  training::extensions::Evaluator whole(std::make_shared<SerialIterator>(data, 4, false, false), classifier);
  whole.set_name("validation");
  std::map<std::string, double> expected = whole.evaluate();
  check(got.size() == expected.size(), "the multi-node evaluator reports other keys than a single-process one");
  for (const auto& [key, value] : expected) {
    check(std::abs(got.at(key) - value) <= 1e-6 * (1 + std::abs(value)),
          "multi-node evaluator: " + key + " is " + std::to_string(got.at(key)) + ", a single process gets " +
              std::to_string(value));
    char v[64];
    std::snprintf(v, sizeof v, "%.17g", got.at(key));
    report.same("multi_node_evaluator " + key, v);
  }
}

std::vector<int> parse_hosts(const std::string& text) {
  std::vector<int> hosts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const int n = std::atoi(item.c_str());
    check(n > 0 && std::to_string(n) == item, "--hosts takes positive counts separated by commas (e.g. 2,2), got '" + text + "'");
    hosts.push_back(n);
  }
  check(!hosts.empty(), "--hosts is empty");
  return hosts;
}

}  // namespace

int main(int argc, char** argv) {
  std::string hosts_text, out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--hosts") hosts_text = argv[i + 1];
    else if (flag == "--out") out = argv[i + 1];
  }
  if (hosts_text.empty() || out.empty() || argc != 5) {
    std::fprintf(stderr, "usage: %s --hosts <ranks per host, e.g. 2,2> --out <file>\n", argv[0]);
    return 2;
  }
  const std::vector<int> hosts = parse_hosts(hosts_text);
  auto world = mn::create_communicator("naive");
  check_topology(*world, hosts);
  Report report(*world);
  for (const char* kind : {"naive", "flat", "dummy"}) mean_grads(report, kind, {}, kind, /*mixed=*/true);
  // One dtype: "flat" keeps the gradients in its reduction buffer, or packs them when told not to.
  for (bool in_buffer : {true, false}) {
    mn::CommunicatorOptions options;
    options.gradients_in_buffer = in_buffer;
    mean_grads(report, "flat", options, in_buffer ? "flat(float32, in buffer)" : "flat(float32, packed)",
               /*mixed=*/false);
  }
  broadcast_and_collectives(report);
  datasets_and_evaluation(report);
  if (world->rank() == 0) {
    const std::string text = report.text();
    write_file_bytes(out, std::vector<uint8_t>(text.begin(), text.end()));
    std::printf("multi_host_check: %d ranks on %zu hosts passed; results in %s\n", world->size(), hosts.size(),
                out.c_str());
  }
  world->barrier();
  return 0;
}
