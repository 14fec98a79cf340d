// Run with KUSARI_CUDA_LIBRARY and KUSARI_NCCL_LIBRARY naming files that do not exist, as on a
// machine where kusari's GPU libraries (or the CUDA libraries they need) are missing: the CPU
// works, no GPU is reported, and asking for one raises an error that quotes the loader's reason.
// Exits non-zero on the first expectation that fails.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kusari/config.h"
#include "kusari/core/array.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"
#include "kusari/core/routines.h"
#include "kusari/mn.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

template <typename Error, typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "(nothing thrown)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int main() {
  const char* cuda_file = std::getenv("KUSARI_CUDA_LIBRARY");
  const char* nccl_file = std::getenv("KUSARI_NCCL_LIBRARY");
  if (!cuda_file || !nccl_file) {
    std::printf("FAILED: set KUSARI_CUDA_LIBRARY and KUSARI_NCCL_LIBRARY to missing files\n");
    return 2;
  }
  // With the GPU libraries loaded at run time, the reason names the missing file; in a build
  // without them (or a static one, which has them built in) it says what the build lacks.
  const bool loaded_at_run_time = KUSARI_HAVE_CUDA && !KUSARI_CUDA_BUILTIN;

  kusari::Array a = kusari::Array::full({3}, 2.0);
  expect((a * a).to_vector<float>()[2] == 4.0f, "CPU arrays work");
  expect(kusari::cuda_device_count() == 0, "cuda_device_count() is 0");
  expect(!kusari::cuda_available(), "cuda_available() is false");

  const std::string gpu = message_of<kusari::DeviceError>(
      [] { kusari::Array::zeros({2}, kusari::float32, kusari::Device::cuda(0)); });
  std::printf("  Array on cuda:0 -> %s\n", gpu.c_str());
  expect(contains(gpu, "CUDA is unavailable"), "an array on cuda:0 raises DeviceError: CUDA is unavailable");
  expect(loaded_at_run_time ? contains(gpu, cuda_file) && contains(gpu, "KUSARI_CUDA_LIBRARY")
                            : contains(gpu, "no CUDA support") || KUSARI_CUDA_BUILTIN,
         "the error quotes the loader's reason");

  const std::string graph = message_of<kusari::DeviceError>(
      [] { kusari::cuda::Graph().capture(kusari::Device::cuda(0), [] {}); });
  expect(contains(graph, "cuda::Graph::capture") && contains(graph, "CUDA is unavailable"),
         "cuda::Graph::capture says CUDA is unavailable");
  expect(!kusari::cuda::is_capturing(kusari::Device::cuda(0)), "is_capturing(cuda:0) is false");
  kusari::cuda::empty_cache();  // a no-op, not an error

  auto naive = kusari::mn::create_communicator("naive");
  expect(naive->allreduce(a).to_vector<float>()[0] == 2.0f * naive->size(), "the naive communicator works");
  const std::string nccl = message_of<kusari::CommunicatorError>(
      [] { kusari::mn::create_communicator("pure_nccl"); });
  std::printf("  pure_nccl -> %s\n", nccl.c_str());
  expect(contains(nccl, "'pure_nccl' needs CUDA and NCCL") &&
             (!(KUSARI_HAVE_NCCL && loaded_at_run_time) || contains(nccl, nccl_file)),
         "create_communicator(\"pure_nccl\") quotes the loader's reason");

  std::printf("%d passed, %d failed\n", 9 - failures, failures);
  return failures == 0 ? 0 : 1;
}
