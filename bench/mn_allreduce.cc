// Gradient allreduce of a ResNet-50-sized model (161 parameters, 25,557,032 values) through each
// NCCL communicator's multi_node_mean_grad (pack, collectives and unpack, pipelined in chunks:
// Note [Gradient pipeline]), against one raw ncclAllReduce of a flat buffer of the same size in
// the same run. Rank 0 prints the chunk setting and the chunks it made, the median time, the
// algorithm and bus bandwidth (busbw = algbw * 2(n-1)/n, as nccl-tests reports it) and each
// path's ratio to the raw allreduce, then the command that reproduces it.
//
//   mpiexec -n 2 bench_mn_allreduce [--repeats 30] [--warmup 5] [--wire float32|float16|bfloat16]
//       [--kinds pure_nccl,hierarchical,two_dimensional,non_cuda_aware,single_node]
//       [--chunk-bytes off,4M,8M,16M,32M,auto]
//
// pure_nccl runs once per --chunk-bytes setting (each a KUSARI_MN_CHUNK_BYTES value: "off" is one
// chunk, "auto" the automatic size), each pipelined row followed by a "raw, in pieces" row: the
// flat buffer reduced in as many back-to-back ncclAllReduce calls, without packing, which shows
// what the cutting alone costs NCCL. The other kinds run with KUSARI_MN_CHUNK_BYTES as set in
// the environment, else "auto". Without the flag, a KUSARI_MN_CHUNK_BYTES in the environment is
// the only setting.
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
};

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

/// The slowest rank's median seconds of `op`, timed with CUDA events on the compute stream.
double time_op(mn::Communicator& world, Device device, int warmup, int repeats,
               const std::function<void()>& op) {
  mn::GpuTimer timer(device);
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    world.barrier();  // start together, so that the time is not a peer's lateness
    timer.start();
    op();
    timer.stop();
    t.push_back(timer.seconds());
  }
  std::sort(t.begin(), t.end());
  return world.allreduce_obj(t[t.size() / 2], mn::ReduceOp::kMax);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = std::stoi(kusari::bench::flag(argc, argv, "repeats", "30"));
  const int warmup = std::stoi(kusari::bench::flag(argc, argv, "warmup", "5"));
  const Dtype wire = kusari::dtype_from_name(kusari::bench::flag(argc, argv, "wire", "float32"));
  const std::string kinds_flag = kusari::bench::flag(
      argc, argv, "kinds", "pure_nccl,hierarchical,two_dimensional,non_cuda_aware,single_node");
  // The chunk-size settings: the communicators read KUSARI_MN_CHUNK_BYTES when they are made.
  const char* chunk_var = std::getenv("KUSARI_MN_CHUNK_BYTES");
  const std::optional<std::string> chunk_env =
      chunk_var ? std::optional<std::string>(chunk_var) : std::nullopt;
  const std::string default_setting = chunk_env.value_or("auto");
  const std::vector<std::string> settings = split_list(
      kusari::bench::flag(argc, argv, "chunk-bytes", chunk_env.value_or("off,4M,8M,16M,32M,auto")));

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
  {
    Row r;
    r.name = "raw ncclAllReduce";
    r.setting = "-";
    r.seconds = time_op(*world, device, warmup, repeats, [&] { raw->allreduce_inplace(flat); });
    rows.push_back(r);
  }
  // The same buffer reduced in `chunks` back-to-back ncclAllReduce calls of equal pieces: what
  // cutting costs NCCL itself, without packing (beside each pipelined pure_nccl row).
  auto raw_in_pieces = [&](const std::string& setting, int chunks) {
    Row r;
    r.name = "raw, in pieces";
    r.setting = setting;
    r.chunks = chunks;
    r.seconds = time_op(*world, device, warmup, repeats,
                        [&] { mn::allreduce_in_pieces(*raw, flat, chunks); });
    return r;
  };
  for (const std::string& kind : split_list(kinds_flag)) {
    const std::vector<std::string> kind_settings =
        kind == "pure_nccl" ? settings : std::vector<std::string>{default_setting};
    for (const std::string& setting : kind_settings) {
      Row r;
      r.name = kind;
      r.setting = setting;
      mn::CommunicatorOptions options;
      if (wire != kusari::float32) options.allreduce_grad_dtype = wire;
      std::shared_ptr<mn::Communicator> comm;
      setenv("KUSARI_MN_CHUNK_BYTES", setting.c_str(), 1);
      try {
        comm = mn::create_communicator(kind, options);
      } catch (const kusari::Error& e) {
        r.note = e.what();  // e.g. single_node across hosts: every rank refuses alike
      }
      if (chunk_env) {
        setenv("KUSARI_MN_CHUNK_BYTES", chunk_env->c_str(), 1);
      } else {
        unsetenv("KUSARI_MN_CHUNK_BYTES");
      }
      if (comm) {
        r.setting = mn::gradient_chunk_setting(*comm);
        model.fill_gradients(device);
        r.seconds =
            time_op(*world, device, warmup, repeats, [&] { comm->multi_node_mean_grad(model); });
        r.chunks = mn::gradient_chunks(*comm);
      }
      rows.push_back(r);
      if (kind == "pure_nccl" && r.chunks > 1) rows.push_back(raw_in_pieces(r.setting, r.chunks));
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
    std::printf("%-20s %8s %6s %10s %12s %12s %10s\n", "path", "chunk", "chunks", "ms",
                "algbw GB/s", "busbw GB/s", "vs raw");
    const double raw_seconds = rows.front().seconds;
    for (const Row& r : rows) {
      if (!r.note.empty()) {
        std::printf("%-20s %8s %s\n", r.name.c_str(), r.setting.c_str(),
                    ("not run: " + r.note).c_str());
        continue;
      }
      const double algbw = bytes / r.seconds / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      std::printf("%-20s %8s %6d %10.3f %12.2f %12.2f %10.3f\n", r.name.c_str(), r.setting.c_str(),
                  r.chunks, r.seconds * 1e3, algbw, busbw, raw_seconds / r.seconds);
    }
    std::printf(
        "(vs raw = raw time / path time: 1.0 means the path costs nothing beyond the allreduce; "
        "chunk = KUSARI_MN_CHUNK_BYTES, chunks = pipeline chunks of the gradient buffer)\n");
    std::string env;
    if (pretend) env += "KUSARI_MN_RANKS_PER_HOST=" + saved + " ";
    if (chunk_env) env += "KUSARI_MN_CHUNK_BYTES=" + *chunk_env + " ";
    std::printf("reproduce: %smpiexec -n %d %s\n", env.c_str(), n,
                kusari::bench::command_line(argc, argv).c_str());
  }
  return 0;
}
