// Gradient allreduce of a ResNet-50-sized model (161 parameters, 25,557,032 values) through each
// NCCL communicator's multi_node_mean_grad, against one raw ncclAllReduce of a flat buffer of the
// same size in the same run. Rank 0 prints the chunk setting and the chunks it made, the median
// time, the algorithm and bus bandwidth (busbw = algbw * 2(n-1)/n, as nccl-tests reports it) and
// each path's ratio to its raw reference, then the command that reproduces it. Each path is
// timed in turns with its reference (one call of each per repeat), so that the ratio compares
// the same minutes of the machine: the raw allreduce alone varied by 10% between runs.
//
//   mpiexec -n 2 bench_mn_allreduce [--repeats 100] [--warmup 5] [--wire float32|float16|bfloat16]
//       [--kinds pure_nccl,hierarchical,two_dimensional,non_cuda_aware,single_node]
//       [--chunk-bytes off,4M,8M,16M,32M,auto]
//
// Each kind runs twice: "<kind>" keeps the gradients in the communicator's reduction buffer
// (CommunicatorOptions::gradients_in_buffer, the default: the first call copies the gradients
// in, every later call is the allreduce alone; Note [Gradients in the reduction buffer]), and
// "<kind> packed" turns that off (pack, collectives and unpack, pipelined in chunks: Note
// [Gradient pipeline]). A row whose gradients did not end in one buffer (a 16-bit --wire casts
// them, so it packs) is marked "(fallback)". pure_nccl packed runs once per --chunk-bytes setting
// (each a KUSARI_MN_CHUNK_BYTES value: "off" is one chunk, "auto" the automatic size), each
// pipelined row followed by a "raw, in pieces" row: the flat buffer reduced in as many
// back-to-back ncclAllReduce calls, without packing, which shows what the cutting alone costs
// NCCL. The other kinds, and the in-buffer rows, run with KUSARI_MN_CHUNK_BYTES as set in the
// environment, else "auto". Without the flag, a KUSARI_MN_CHUNK_BYTES in the environment is the
// only setting.
//
// With pure_nccl among the kinds, three more rows time the whole gradient path as a training step
// runs it: model.cleargrads(), backward of
// loss = sum_i sum(p_i * c_i) (a fixed coefficient array c_i per parameter, so d loss / d p_i =
// c_i, one fresh array per parameter), then the reduction: "backward + raw ncclAllReduce" (no
// buffer: the leaves adopt their gradients, and a separate flat buffer is reduced), the
// reference of the two rows after it; "backward + pure_nccl" (the reduction copies backward's
// gradients into their segments with one kernel and reduces in place); "backward + pure_nccl
// packed" (pack, reduce, unpack).
//
// Each process uses GPU intra_rank of its host. KUSARI_MN_RANKS_PER_HOST=1 makes every rank its
// own (pretend) host, so that the inter-host paths run on one machine.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "kusari/mn/benchmark.h"

using kusari::Array;
using kusari::Device;
using kusari::Dtype;
using kusari::Shape;
namespace mn = kusari::mn;

namespace {

/// The parameter shapes of ResNet-50 (torchvision layout): 53 convolutions, 53 batch
/// normalizations (gamma, beta), the final linear layer.
std::vector<Shape> resnet50_shapes() {
  std::vector<Shape> s;
  auto bn = [&](int64_t c) {
    s.push_back({c});
    s.push_back({c});
  };
  s.push_back({64, 3, 7, 7});
  bn(64);
  int64_t in = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t width = int64_t{64} << layer;
    for (int b = 0; b < blocks[layer]; ++b) {
      s.push_back({width, in, 1, 1});
      bn(width);
      s.push_back({width, width, 3, 3});
      bn(width);
      s.push_back({width * 4, width, 1, 1});
      bn(width * 4);
      if (b == 0) {
        s.push_back({width * 4, in, 1, 1});
        bn(width * 4);
      }
      in = width * 4;
    }
  }
  s.push_back({1000, 2048});
  s.push_back({1000});
  return s;
}

class GradientModel : public kusari::Link {
 public:
  GradientModel(const std::vector<Shape>& shapes, Device device) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      char name[16];
      std::snprintf(name, sizeof(name), "p%03zu", i);
      add_param(name, kusari::Parameter(Array::zeros(shapes[i], kusari::float32, device)));
    }
  }
  void fill_gradients(Device device) {
    for (auto& [path, p] : namedparams())
      p.set_grad(Array::uniform(p.shape(), -1.0, 1.0, kusari::float32, device));
  }
  const char* type_name() const override { return "GradientModel"; }
};

struct Row {
  std::string name;
  std::string setting;  // the chunk-size setting
  int chunks = 1;       // the chunks the last reduction was cut into
  std::string note;     // why a kind did not run
  double seconds = 0;
  double reference = 0;  // the median of the row's reference, timed alternately with it
};

/// True when every gradient of `model` is its bound gradient buffer, all in one allocation (the
/// communicator kept them in its reduction buffer).
bool gradients_in_one_buffer(kusari::Link& model) {
  auto params = model.namedparams();
  for (auto& [path, p] : params) {
    if (!p.grad_in_buffer() || p.grad().storage() != params.front().second.grad().storage())
      return false;
  }
  return !params.empty();
}

/// Splits "a,b,c".
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// The slowest rank's median seconds of each of `ops`, timed with CUDA events on the compute
/// stream. The ops take turns (each repeat runs every op once, the first op of a repeat rotating),
/// so that a drift of the machine during the run (clocks, the other process, NVLink traffic)
/// falls on all of them alike: a path and its reference are always timed this way.
std::vector<double> time_ops(mn::Communicator& world, Device device, int warmup, int repeats,
                             const std::vector<std::function<void()>>& ops) {
  mn::GpuTimer timer(device);
  for (int i = 0; i < warmup; ++i) {
    for (const auto& op : ops) op();
  }
  const size_t n = ops.size();
  std::vector<std::vector<double>> t(n);
  for (int i = 0; i < repeats; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const size_t k = (j + static_cast<size_t>(i)) % n;
      world.barrier();  // start together, so that the time is not a peer's lateness
      timer.start();
      ops[k]();
      timer.stop();
      t[k].push_back(timer.seconds());
    }
  }
  std::vector<double> medians;
  for (auto& times : t) {
    std::sort(times.begin(), times.end());
    medians.push_back(world.allreduce_obj(times[times.size() / 2], mn::ReduceOp::kMax));
  }
  return medians;
}

/// Times `op` alternately with its reference `ref` into r.seconds and r.reference.
void time_row(Row& r, mn::Communicator& world, Device device, int warmup, int repeats,
              const std::function<void()>& op, const std::function<void()>& ref) {
  const std::vector<double> m = time_ops(world, device, warmup, repeats, {op, ref});
  r.seconds = m[0];
  r.reference = m[1];
}

}  // namespace

int main(int argc, char** argv) {
  // The chunk-size settings: the communicators read KUSARI_MN_CHUNK_BYTES when they are made.
  const char* chunk_var = std::getenv("KUSARI_MN_CHUNK_BYTES");
  const std::optional<std::string> chunk_env =
      chunk_var ? std::optional<std::string>(chunk_var) : std::nullopt;
  const std::string default_setting = chunk_env.value_or("auto");

  CLI::App app{"Allreduce of gradient-sized buffers over the multi-node communicators"};
  int repeats = 100, warmup = 5;
  std::string wire_name = "float32";
  std::string kinds_flag = "pure_nccl,hierarchical,two_dimensional,non_cuda_aware,single_node";
  std::string chunk_flag = chunk_env.value_or("off,4M,8M,16M,32M,auto");
  app.add_option("--repeats", repeats, "Timed allreduces per size")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", warmup, "Untimed allreduces first")->capture_default_str()->check(CLI::Range(0, 1 << 30));
  app.add_option("--wire", wire_name, "Dtype on the wire")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--kinds", kinds_flag, "Communicators to time, comma-separated")->capture_default_str();
  app.add_option("--chunk-bytes", chunk_flag,
                 "Chunk-size settings, comma-separated (default: $KUSARI_MN_CHUNK_BYTES when set)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_mn_allreduce")) return 0;
  const Dtype wire = kusari::dtype_from_name(wire_name);
  const std::vector<std::string> settings = split_list(chunk_flag);

  // The GPU of each process: its rank on its real host (pretend hosts do not change it).
  const char* pretend = std::getenv("KUSARI_MN_RANKS_PER_HOST");
  const std::string saved = pretend ? pretend : "";
  if (pretend) unsetenv("KUSARI_MN_RANKS_PER_HOST");
  auto world = mn::create_communicator("flat");
  if (pretend) setenv("KUSARI_MN_RANKS_PER_HOST", saved.c_str(), 1);
  const int rank = world->rank(), n = world->size();
  const int gpus = kusari::cuda_device_count();
  const bool ok_here = gpus > 0 && world->intra_rank() < gpus;
  if (world->allreduce_obj(static_cast<int64_t>(ok_here ? 0 : 1), mn::ReduceOp::kMax) != 0) {
    if (rank == 0) {
      std::fprintf(
          stderr,
          "bench_mn_allreduce: every process needs a GPU of its own (this machine has %d, %s)\n",
          gpus, mn::nccl_version().c_str());
    }
    return 1;
  }
  const Device device = Device::cuda(world->intra_rank());

  const std::vector<Shape> shapes = resnet50_shapes();
  int64_t elements = 0;
  for (const Shape& s : shapes) elements += s.numel();
  kusari::manual_seed(static_cast<uint64_t>(rank));
  GradientModel model(shapes, device);
  const double bytes = static_cast<double>(elements) * static_cast<double>(kusari::itemsize(wire));

  std::vector<Row> rows;
  // The reference: one ncclAllReduce (sum) of one flat buffer, through pure_nccl's
  // allreduce_inplace, which hands a contiguous GPU array straight to ncclAllReduce.
  auto raw = mn::create_communicator("pure_nccl");
  Array flat = Array::zeros({elements}, wire, device);
  const std::function<void()> raw_op = [&] { raw->allreduce_inplace(flat); };
  {
    Row r;
    r.name = "raw ncclAllReduce";
    r.setting = "-";
    r.seconds = r.reference = time_ops(*world, device, warmup, repeats, {raw_op})[0];
    rows.push_back(r);
  }
  if (kusari::is_floating(wire)) {
    // The same with ncclAvg, the operation the gradient path uses (vs raw: what averaging costs).
    Row r;
    r.name = "raw ncclAllReduce avg";
    r.setting = "-";
    time_row(r, *world, device, warmup, repeats,
             [&] { raw->allreduce_inplace(flat, mn::ReduceOp::kMean); }, raw_op);
    rows.push_back(r);
  }
  // The same buffer reduced in `chunks` back-to-back ncclAllReduce calls of equal pieces: what
  // cutting costs NCCL itself, without packing (beside each pipelined pure_nccl row).
  auto raw_in_pieces = [&](const std::string& setting, int chunks) {
    Row r;
    r.name = "raw, in pieces";
    r.setting = setting;
    r.chunks = chunks;
    time_row(r, *world, device, warmup, repeats,
             [&] { mn::allreduce_in_pieces(*raw, flat, chunks); }, raw_op);
    return r;
  };
  // Creates `kind` with KUSARI_MN_CHUNK_BYTES=`setting` (then restored); null, with `r.note`
  // saying why, when the kind refuses this job (e.g. single_node across hosts: every rank alike).
  auto make = [&](const std::string& kind, const std::string& setting, bool in_buffer, Row& r) {
    mn::CommunicatorOptions options;
    if (wire != kusari::float32) options.allreduce_grad_dtype = wire;
    options.gradients_in_buffer = in_buffer;
    std::shared_ptr<mn::Communicator> comm;
    setenv("KUSARI_MN_CHUNK_BYTES", setting.c_str(), 1);
    try {
      comm = mn::create_communicator(kind, options);
    } catch (const kusari::Error& e) {
      r.note = e.what();
    }
    if (chunk_env) {
      setenv("KUSARI_MN_CHUNK_BYTES", chunk_env->c_str(), 1);
    } else {
      unsetenv("KUSARI_MN_CHUNK_BYTES");
    }
    if (comm) r.setting = mn::gradient_chunk_setting(*comm);
    return comm;
  };
  const std::vector<std::string> kinds = split_list(kinds_flag);
  for (const std::string& kind : kinds) {
    // The gradients in the buffer: after the first (warm-up) call, each call is the reduction.
    {
      Row r;
      r.name = kind;
      r.setting = default_setting;
      if (auto comm = make(kind, default_setting, true, r)) {
        model.fill_gradients(device);
        time_row(r, *world, device, warmup, repeats, [&] { comm->multi_node_mean_grad(model); },
                 raw_op);
        r.chunks = mn::gradient_chunks(*comm);
        if (!gradients_in_one_buffer(model)) r.name += " (fallback)";
      }
      rows.push_back(r);
    }
    // Packed: the option off.
    const std::vector<std::string> kind_settings =
        kind == "pure_nccl" ? settings : std::vector<std::string>{default_setting};
    for (const std::string& setting : kind_settings) {
      Row r;
      r.name = kind + " packed";
      r.setting = setting;
      if (auto comm = make(kind, setting, false, r)) {
        model.fill_gradients(device);
        time_row(r, *world, device, warmup, repeats, [&] { comm->multi_node_mean_grad(model); },
                 raw_op);
        r.chunks = mn::gradient_chunks(*comm);
      }
      rows.push_back(r);
      if (kind == "pure_nccl" && r.chunks > 1) rows.push_back(raw_in_pieces(r.setting, r.chunks));
    }
  }

  // The whole gradient path: backward, then the reduction.
  if (std::find(kinds.begin(), kinds.end(), "pure_nccl") != kinds.end()) {
    namespace F = kusari::functions;
    kusari::Variable loss;
    for (auto& [path, p] : model.namedparams()) {
      kusari::Variable c(Array::uniform(p.shape(), -1.0, 1.0, kusari::float32, device));
      kusari::Variable term = F::sum(p * c);
      loss = loss.defined() ? loss + term : term;
    }
    Array flat32 =
        wire == kusari::float32 ? flat : Array::zeros({elements}, kusari::float32, device);
    const std::function<void()> backward_raw = [&] {
      model.cleargrads();
      loss.backward();
      raw->allreduce_inplace(flat32);
    };
    {
      Row r;
      r.name = "backward + raw ncclAllReduce";
      r.setting = "-";
      r.seconds = r.reference = time_ops(*world, device, warmup, repeats, {backward_raw})[0];
      rows.push_back(r);
    }
    for (bool in_buffer : {true, false}) {
      Row r;
      r.name = in_buffer ? "backward + pure_nccl" : "backward + pure_nccl packed";
      r.setting = default_setting;
      if (auto comm = make("pure_nccl", default_setting, in_buffer, r)) {
        time_row(
            r, *world, device, warmup, repeats,
            [&] {
              model.cleargrads();
              loss.backward();
              comm->multi_node_mean_grad(model);
            },
            backward_raw);
        r.chunks = mn::gradient_chunks(*comm);
        if (in_buffer && !gradients_in_one_buffer(model)) r.name += " (fallback)";
      }
      rows.push_back(r);
    }
  }
  raw.reset();

  if (rank == 0) {
    std::printf(
        "gradient allreduce, ResNet-50 sized: %zu parameters, %lld values, wire %s (%.1f MB)\n",
        shapes.size(), static_cast<long long>(elements), kusari::dtype_name(wire), bytes / 1e6);
    std::printf(
        "%d ranks, %d GPU(s) on rank 0's host, %s%s%s; median of %d after %d warm-up, slowest "
        "rank\n",
        n, gpus, mn::nccl_version().c_str(), pretend ? ", KUSARI_MN_RANKS_PER_HOST=" : "",
        pretend ? saved.c_str() : "", repeats, warmup);
    std::printf("%-30s %8s %6s %10s %12s %12s %10s %10s\n", "path", "chunk", "chunks", "ms",
                "algbw GB/s", "busbw GB/s", "ref ms", "vs raw");
    for (const Row& r : rows) {
      if (!r.note.empty()) {
        std::printf("%-30s %8s %s\n", r.name.c_str(), r.setting.c_str(),
                    ("not run: " + r.note).c_str());
        continue;
      }
      const double algbw = bytes / r.seconds / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      std::printf("%-30s %8s %6d %10.3f %12.2f %12.2f %10.3f %10.3f\n", r.name.c_str(),
                  r.setting.c_str(), r.chunks, r.seconds * 1e3, algbw, busbw, r.reference * 1e3,
                  r.reference / r.seconds);
    }
    std::printf(
        "(vs raw = ref ms / ms, ref ms being the median of the row's reference timed in turns with "
        "it: the raw ncclAllReduce, or for the backward rows backward + raw ncclAllReduce; 1.0 "
        "means the path costs nothing beyond them; <kind> = gradients in the reduction buffer, <kind> packed = "
        "gradients_in_buffer off; chunk = KUSARI_MN_CHUNK_BYTES, chunks = pipeline chunks of the "
        "gradient buffer; algbw and busbw of the backward rows count the allreduce's bytes over "
        "the whole time)\n");
    std::string env;
    if (pretend) env += "KUSARI_MN_RANKS_PER_HOST=" + saved + " ";
    if (chunk_env) env += "KUSARI_MN_CHUNK_BYTES=" + *chunk_env + " ";
    std::printf("reproduce: %smpiexec -n %d %s\n", env.c_str(), n,
                kusari::bench::command_line(argc, argv).c_str());
  }
  return 0;
}
