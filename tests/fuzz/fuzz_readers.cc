// A bounded mutation fuzzer for the readers of files that come from outside: npz (read_npz),
// IDX and gzip'd IDX (read_idx), and JPEG / PNG images (decode_image, read_image_info).
//
//   kusari_fuzz_readers --target npz|idx|image --corpus DIR [--runs N] [--seed S] [--findings DIR]
//   kusari_fuzz_readers --write-seeds DIR     (re-creates the seed corpus with kusari's writers)
//
// Each run takes a seed file of the target's corpus, mutates it (see Note [Mutations]) and feeds
// it to the reader. A kusari::Error (a clear message about a bad file) is the expected outcome of
// a bad input; anything else - another exception, a crash, a hang - is a finding: the input is
// saved to --findings and the program exits 1. Run under the sanitizer build
// (scripts/sanitize.sh) to turn memory errors into findings too.
//
// Note [Mutations]
// One to four edits per run, drawn from: flip a bit; set a byte to 0x00, 0xff, 0x7f or 0x80; write
// a 32-bit value that is small, negative, huge or a neighbour of the file size, big- or
// little-endian (header fields: IDX dimensions, NPY shapes, zip sizes and offsets, JPEG marker
// lengths); truncate; insert random bytes; duplicate or delete a block. Edits land in the
// first 64 bytes half of the time, where the headers are.
#include <CLI/CLI.hpp>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kusari/datasets/image.h"
#include "kusari/kusari.h"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

void write_gzip(const fs::path& p, const Bytes& b) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}

void put32(Bytes& b, size_t at, uint32_t v, bool big_endian) {
  for (int k = 0; k < 4 && at + static_cast<size_t>(k) < b.size(); ++k) {
    const int shift = big_endian ? 24 - 8 * k : 8 * k;
    b[at + static_cast<size_t>(k)] = static_cast<uint8_t>(v >> shift);
  }
}

Bytes mutate(Bytes b, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    if (b.empty()) b.push_back(0);
    const size_t head = std::min<size_t>(b.size(), 64);
    const size_t at = (rng() % 2 == 0) ? rng() % head : rng() % b.size();
    switch (rng() % 8) {
      case 0:
        b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1: {
        static constexpr uint8_t kValues[] = {0x00, 0xff, 0x7f, 0x80};
        b[at] = kValues[rng() % 4];
        break;
      }
      case 2: {
        const uint32_t size = static_cast<uint32_t>(b.size());
        const uint32_t kValues[] = {0u,          1u,          0xffffffffu, 0x7fffffffu, 0x80000000u,
                                    size,        size + 1u,   size - 1u,   0x00ffffffu, 1u << 20};
        put32(b, at, kValues[rng() % 10], rng() % 2 == 0);
        break;
      }
      case 3:
        b.resize(rng() % b.size());
        break;
      case 4: {
        const size_t n = 1 + rng() % 16;
        Bytes extra(n);
        for (auto& x : extra) x = static_cast<uint8_t>(rng());
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), extra.begin(), extra.end());
        break;
      }
      case 5: {
        const size_t n = std::min<size_t>(1 + rng() % 64, b.size() - at);
        const Bytes block(b.begin() + static_cast<std::ptrdiff_t>(at),
                          b.begin() + static_cast<std::ptrdiff_t>(at + n));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), block.begin(), block.end());
        break;
      }
      case 6: {
        const size_t n = std::min<size_t>(1 + rng() % 64, b.size() - at);
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      default:
        b[at] = static_cast<uint8_t>(rng());
        break;
    }
  }
  return b;
}

/// Feeds one input to the target's reader; returns normally or throws.
void feed(const std::string& target, const Bytes& input, const fs::path& scratch, bool gz) {
  if (target == "image") {
    // Headers first (what the loader plans crops with), then the pixels.
    (void)kusari::read_image_info(input.data(), input.size(), "fuzz input");
    (void)kusari::decode_image(input.data(), input.size(), "fuzz input");
    return;
  }
  const fs::path file = scratch / (target == "npz" ? "input.npz" : gz ? "input.gz" : "input");
  kusari::write_file_bytes(file.string(), input);
  if (target == "npz") {
    (void)kusari::read_npz(file.string());
  } else {
    (void)kusari::read_idx(file.string());
  }
}

/// The seed corpus, made with kusari's own writers (tiny files, so a run is fast).
void write_seeds(const fs::path& dir) {
  fs::create_directories(dir / "npz");
  fs::create_directories(dir / "idx");
  fs::create_directories(dir / "image");
  kusari::NamedArrays arrays;
  arrays.emplace_back("a", kusari::Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, kusari::Shape{2, 3}));
  arrays.emplace_back("b/c", kusari::Array::from_vector(std::vector<int64_t>{7, 8}));
  kusari::write_npz((dir / "npz" / "stored.npz").string(), arrays, false);
  kusari::write_npz((dir / "npz" / "deflated.npz").string(), arrays, true);
  // IDX: 3 images of 4x4 (magic 0x00000803) and 3 labels (0x00000801), plain and gzip'd.
  Bytes images = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 4};
  for (int i = 0; i < 48; ++i) images.push_back(static_cast<uint8_t>(i * 5));
  kusari::write_file_bytes((dir / "idx" / "images").string(), images);
  const Bytes labels = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3};
  kusari::write_file_bytes((dir / "idx" / "labels").string(), labels);
  write_gzip(dir / "idx" / "images.gz", images);
  write_gzip(dir / "idx" / "labels.gz", labels);
  kusari::Image image;
  image.height = 12;
  image.width = 16;
  image.channels = 3;
  image.pixels.resize(12 * 16 * 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 7);
  kusari::write_jpeg((dir / "image" / "rgb.jpg").string(), image);
  kusari::write_png((dir / "image" / "rgb.png").string(), image);
  image.channels = 1;
  image.pixels.resize(12 * 16);
  kusari::write_jpeg((dir / "image" / "grey.jpg").string(), image);
  kusari::write_png((dir / "image" / "grey.png").string(), image);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kusari: mutation fuzzer of the npz, IDX and image readers"};
  std::string target, corpus, findings = "fuzz-findings", seeds_dir;
  int64_t runs = 100000;
  uint64_t seed = 1;
  app.add_option("--target", target, "npz, idx or image")->check(CLI::IsMember({"npz", "idx", "image"}));
  app.add_option("--corpus", corpus, "Seed corpus directory (holds npz/, idx/, image/)");
  app.add_option("--runs", runs, "Mutated inputs to feed")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of the mutations")->capture_default_str();
  app.add_option("--findings", findings, "Where inputs that are findings are saved")->capture_default_str();
  app.add_option("--write-seeds", seeds_dir, "Write the seed corpus into this directory and exit");
  CLI11_PARSE(app, argc, argv);
  if (!seeds_dir.empty()) {
    write_seeds(seeds_dir);
    return 0;
  }
  if (target.empty() || corpus.empty()) {
    std::fprintf(stderr, "kusari_fuzz_readers: --target and --corpus are required (or --write-seeds DIR)\n");
    return 2;
  }
  std::vector<std::pair<Bytes, bool>> inputs;  // (bytes, gzip'd IDX)
  for (const auto& entry : fs::directory_iterator(fs::path(corpus) / target)) {
    if (!entry.is_regular_file()) continue;
    inputs.emplace_back(kusari::read_file_bytes(entry.path().string()), entry.path().extension() == ".gz");
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "kusari_fuzz_readers: no seed files in %s/%s\n", corpus.c_str(), target.c_str());
    return 2;
  }
  const fs::path scratch = (fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path()) / ("kusari_fuzz_" + target + "_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  std::mt19937_64 rng(seed);
  int64_t rejected = 0, accepted = 0;
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  for (int64_t run = 0; run < runs; ++run) {
    const auto& [base, gz] = inputs[rng() % inputs.size()];
    const Bytes input = mutate(base, rng);
    try {
      feed(target, input, scratch, gz);
      ++accepted;
    } catch (const kusari::Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      fs::create_directories(findings);
      const fs::path saved = fs::path(findings) / (target + "_run" + std::to_string(run));
      kusari::write_file_bytes(saved.string(), input);
      std::fprintf(stderr, "kusari_fuzz_readers: run %lld: %s escaped as a non-kusari exception: %s (input saved as %s)\n",
                   static_cast<long long>(run), target.c_str(), e.what(), saved.string().c_str());
      status = 1;
      break;
    }
  }
  fs::remove_all(scratch);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %lld runs in %.1f s, %lld rejected with a kusari error, %lld accepted, %s\n", target.c_str(),
              static_cast<long long>(accepted + rejected), seconds, static_cast<long long>(rejected),
              static_cast<long long>(accepted), status == 0 ? "no finding" : "FINDING");
  return status;
}
