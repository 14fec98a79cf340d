#include "kusari/datasets/mnist.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <type_traits>
#include <vector>

#include "kusari/config.h"
#include "kusari/core/error.h"

#include <zlib.h>

namespace kusari {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr int64_t kClasses = 10;
// An IDX header that promises more than this is taken as malformed rather than allocated.
constexpr int64_t kMaxIdxBytes = int64_t{1} << 36;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08X", v);
  return buf;
}

// Reads the bytes of a file that may be gzip-compressed; see Note [MNIST files].
class ByteReader {
 public:
  ByteReader(const std::string& path, const char* fn) : path_(path), fn_(fn) {
    file_ = gzopen(path.c_str(), "rb");
    KUSARI_CHECK(file_ != nullptr, IOError, fn_, ": cannot open ", path_, ": ",
                 std::strerror(errno));
    gzbuffer(file_, 1 << 20);
  }
  ~ByteReader() {
    gzclose(file_);
  }
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  // True when the file is gzip data (false: its bytes are read as they are).
  bool compressed() { return gzdirect(file_) == 0; }

  // Reads up to n bytes; returns fewer only at the end of the data.
  int64_t read(void* dst, int64_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    int64_t got = 0;
    while (got < n) {
      const int64_t want = std::min<int64_t>(n - got, int64_t{1} << 30);
      const int r = gzread(file_, out + got, static_cast<unsigned>(want));
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_, &errnum);
        KUSARI_THROW(IOError, fn_, ": cannot read ", path_, ": ", msg,
                     " (the gzip data is corrupt or the file is truncated)");
      }
      if (r == 0) break;
      got += r;
    }
    return got;
  }

  // Why the data ended early, when the decompressor knows ("" otherwise).
  std::string end_reason() {
    int errnum = Z_OK;
    const char* msg = gzerror(file_, &errnum);
    if (errnum != Z_OK) return std::string(" (") + msg + ")";
    return "";
  }

 private:
  std::string path_;
  const char* fn_;
  gzFile file_ = nullptr;
};

struct IdxHeader {
  uint32_t magic = 0;
  Shape shape;
  int64_t total = 0;  // number of data bytes
};

uint32_t read_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

IdxHeader read_idx_header(ByteReader& in, const std::string& path, const char* fn) {
  unsigned char head[4];
  const int64_t got_head = in.read(head, 4);
  KUSARI_CHECK(got_head == 4, IOError, fn, ": ", path, " is too short to be an IDX file (",
               got_head, " bytes; the magic number alone takes 4)", in.end_reason());
  IdxHeader h;
  h.magic = read_be32(head);
  KUSARI_CHECK(head[0] == 0 && head[1] == 0 && head[3] >= 1, IOError, fn, ": ", path,
               " does not start with an IDX magic number: got ", hex32(h.magic),
               ", expected 0x000008NN (two zero bytes, a type byte, a dimension count >= 1)");
  KUSARI_CHECK(head[2] == 0x08, IOError, fn, ": ", path, " holds IDX elements of type ",
               hex32(head[2]), " (magic ", hex32(h.magic),
               "); only unsigned bytes (type 0x08) are supported");
  const int ndim = head[3];
  std::vector<unsigned char> dims_raw(static_cast<size_t>(4 * ndim));
  const int64_t got_dims = in.read(dims_raw.data(), 4 * ndim);
  KUSARI_CHECK(got_dims == 4 * ndim, IOError, fn, ": ", path, " is truncated in its header: magic ",
               hex32(h.magic), " announces ", ndim, " dimensions (", 4 * ndim, " bytes) but only ",
               got_dims, " bytes follow", in.end_reason());
  h.total = 1;
  for (int d = 0; d < ndim; ++d) {
    const int64_t len = read_be32(&dims_raw[static_cast<size_t>(4 * d)]);
    h.shape.push_back(len);
    h.total = len == 0 ? 0 : (h.total > kMaxIdxBytes / len ? kMaxIdxBytes + 1 : h.total * len);
  }
  KUSARI_CHECK(h.total <= kMaxIdxBytes, IOError, fn, ": ", path,
               " has an implausible IDX header: shape ", h.shape, " would need more than ",
               kMaxIdxBytes, " bytes");
  // Note [IDX headers against the file size]
  // The header's shape decides how much is allocated before any data is read, so a header that
  // lies (16.7 M images in a file of 2,000) used to end in "out of memory allocating 52595988480
  // bytes", naming no file. The file's size bounds what it can hold: a plain file holds exactly
  // its bytes after the header; deflate expands at most 1032:1, so a .gz file of S bytes holds
  // at most 1032 * S. A promise beyond that is an IOError naming the file before allocating;
  // a .gz file within the bound that ends early is caught by read_idx_body's chunked reads.
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec) {
    const int64_t file_bytes = static_cast<int64_t>(size);
    const int64_t header_bytes = 4 + 4 * int64_t{ndim};
    if (!in.compressed()) {
      KUSARI_CHECK(h.total <= file_bytes - header_bytes, IOError, fn, ": ", path,
                   " is truncated: its header (magic ", hex32(h.magic), ", shape ", h.shape,
                   ") promises ", h.total, " bytes of data but the file holds only ",
                   file_bytes - header_bytes, " after the header");
    } else {
      constexpr int64_t kMaxDeflateRatio = 1032;
      KUSARI_CHECK(h.total / kMaxDeflateRatio <= file_bytes, IOError, fn, ": ", path,
                   " is truncated: its header (magic ", hex32(h.magic), ", shape ", h.shape,
                   ") promises ", h.total, " bytes of data but a gzip file of ", file_bytes,
                   " bytes can hold at most ", file_bytes * kMaxDeflateRatio);
    }
  }
  return h;
}

// Reads the h.total data bytes in chunks, handing each to consume(bytes, offset, count) while it
// is still in cache, then checks that nothing follows them.
template <typename Consume>
void read_idx_body(ByteReader& in, const IdxHeader& h, const std::string& path, const char* fn,
                   Consume&& consume) {
  constexpr int64_t kChunk = int64_t{1} << 18;
  std::vector<unsigned char> buf(
      static_cast<size_t>(std::min(kChunk, std::max<int64_t>(h.total, 1))));
  int64_t done = 0;
  while (done < h.total) {
    const int64_t want = std::min<int64_t>(kChunk, h.total - done);
    const int64_t got = in.read(buf.data(), want);
    if (got > 0) consume(buf.data(), done, got);
    done += got;
    KUSARI_CHECK(got == want, IOError, fn, ": ", path, " is truncated: its header (magic ",
                 hex32(h.magic), ", shape ", h.shape, ") promises ", h.total,
                 " bytes of data but only ", done, " follow", in.end_reason());
  }
  unsigned char extra = 0;
  KUSARI_CHECK(in.read(&extra, 1) == 0, IOError, fn, ": ", path,
               " is longer than its header (magic ", hex32(h.magic), ", shape ", h.shape,
               ") says: extra bytes follow the ", h.total, " bytes of data");
}

// The whole file as a uint8 array of the header's shape.
Array read_idx_array(const std::string& path, const char* fn, uint32_t* magic) {
  ByteReader in(path, fn);
  const IdxHeader h = read_idx_header(in, path, fn);
  if (magic != nullptr) *magic = h.magic;
  Array data = Array::empty(h.shape, uint8, Device::cpu());
  auto* dst = static_cast<unsigned char*>(data.raw_data());
  read_idx_body(in, h, path, fn, [&](const unsigned char* p, int64_t offset, int64_t n) {
    std::memcpy(dst + offset, p, static_cast<size_t>(n));
  });
  return data;
}

// The file `name` or `name.gz` in `dir`; see Note [MNIST files].
std::string find_idx_file(const std::string& dir, const std::string& name, const char* fn) {
  const fs::path plain = fs::path(dir) / name;
  fs::path gz = plain;
  gz += ".gz";
  std::error_code ec;
  if (fs::is_regular_file(plain, ec)) return plain.string();
  if (fs::is_regular_file(gz, ec)) return gz.string();
  for (const fs::path& p : {plain, gz}) {
    KUSARI_CHECK(!fs::is_directory(p, ec), IOError, fn, ": cannot read ", name, " from ", dir,
                 ": ", p.string(), " is a directory, expected an IDX file");
  }
  KUSARI_CHECK(fs::is_directory(dir, ec), IOError, fn, ": the data directory ", dir,
               " does not exist (looked for ", plain.string(), "[.gz])");
  KUSARI_THROW(IOError, fn, ": cannot find ", name, " in ", dir, ": neither ", plain.string(),
               " nor ", gz.string(), " exists");
}

Array load_images(const std::string& path, const MnistOptions& o, const char* fn) {
  ByteReader in(path, fn);
  const IdxHeader h = read_idx_header(in, path, fn);
  KUSARI_CHECK(h.magic == kImageMagic, IOError, fn, ": ", path, " has magic number ",
               hex32(h.magic), " but an image file needs ", hex32(kImageMagic),
               " (unsigned bytes, 3 dimensions)");
  KUSARI_CHECK(h.shape[1] == kRows && h.shape[2] == kCols, IOError, fn, ": ", path,
               " holds images of shape (", h.shape[1], ", ", h.shape[2], "); MNIST images are (",
               kRows, ", ", kCols, ")");
  const int64_t n = h.shape[0];
  const Shape out_shape = o.ndim == 1   ? Shape{n, kRows * kCols}
                          : o.ndim == 2 ? Shape{n, kRows, kCols}
                                        : Shape{n, 1, kRows, kCols};
  Array out = Array::empty(out_shape, o.dtype, Device::cpu());
  visit_dtype(o.dtype, [&](auto zero) {
    using T = decltype(zero);
    // Each byte goes through a table to its final value. Chainer computes
    // float32(pixel) * float32(scale / 255); that rounding is kept for the 32- and 16-bit types.
    T table[256];
    for (int v = 0; v < 256; ++v) {
      if constexpr (std::is_same_v<T, double>) {
        table[v] = static_cast<double>(v) * (o.scale / 255.0);
      } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, Half> ||
                           std::is_same_v<T, BFloat16>) {
        table[v] = T(static_cast<float>(v) * static_cast<float>(o.scale / 255.0));
      } else {
        table[v] = static_cast<T>(v);  // integer dtypes keep raw pixels (check_options: scale 255)
      }
    }
    T* dst = static_cast<T*>(out.raw_data());
    read_idx_body(in, h, path, fn, [&](const unsigned char* p, int64_t offset, int64_t count) {
      T* d = dst + offset;
      for (int64_t i = 0; i < count; ++i) d[i] = table[p[i]];
    });
  });
  return out;
}

Array load_labels(const std::string& path, const MnistOptions& o, const char* fn) {
  uint32_t magic = 0;
  Array data = read_idx_array(path, fn, &magic);
  KUSARI_CHECK(magic == kLabelMagic, IOError, fn, ": ", path, " has magic number ", hex32(magic),
               " but a label file needs ", hex32(kLabelMagic), " (unsigned bytes, 1 dimension)");
  const auto* p = static_cast<const uint8_t*>(data.raw_data());
  for (int64_t i = 0; i < data.size(); ++i) {
    KUSARI_CHECK(p[i] < kClasses, IOError, fn, ": ", path, " has label ", int{p[i]}, " at index ",
                 i, "; MNIST labels are 0..", kClasses - 1);
  }
  return data.astype(o.label_dtype);
}

std::shared_ptr<TupleDataset> load_split(const std::string& dir, const std::string& prefix,
                                         const MnistOptions& o, const char* fn) {
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte", fn);
  std::string labels_path;
  if (o.withlabel) labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte", fn);
  Array images = load_images(images_path, o, fn);
  if (!o.withlabel) return std::make_shared<TupleDataset>(std::vector<Array>{images});
  Array labels = load_labels(labels_path, o, fn);
  KUSARI_CHECK(labels.shape()[0] == images.shape()[0], IOError, fn, ": ", images_path, " holds ",
               images.shape()[0], " images but ", labels_path, " holds ", labels.shape()[0],
               " labels; they must match");
  return std::make_shared<TupleDataset>(std::vector<Array>{images, labels});
}

void check_options(const MnistOptions& o, const char* fn) {
  KUSARI_CHECK(o.ndim >= 1 && o.ndim <= 3, ValueError, fn,
               ": ndim must be 1 (784,), 2 (28, 28) or 3 (1, 28, 28), got ", o.ndim);
  KUSARI_CHECK(o.dtype != bool_, DtypeError, fn, ": the image dtype cannot be bool");
  KUSARI_CHECK(o.label_dtype != bool_, DtypeError, fn, ": the label dtype cannot be bool");
  KUSARI_CHECK(is_floating(o.dtype) || o.scale == 255.0, ValueError, fn,
               ": the integer image dtype ", dtype_name(o.dtype),
               " keeps raw pixel values 0..255, so scale must be 255 (got ", o.scale,
               "); use a floating dtype to scale pixels");
  KUSARI_CHECK(o.scale > 0.0, ValueError, fn, ": scale must be positive, got ", o.scale);
}

std::string dataset_directory(const MnistOptions& o, const char* subdir, const char* system_dir,
                              const char* fn) {
  if (!o.directory.empty()) return o.directory;
  if (const char* root = std::getenv("KUSARI_DATASET_ROOT"); root != nullptr && *root != '\0') {
    return (fs::path(root) / subdir).string();
  }
  KUSARI_CHECK(system_dir != nullptr, IOError, fn,
               ": no data directory: set MnistOptions::directory to the folder ",
               "holding the IDX files, or KUSARI_DATASET_ROOT to a folder with a '", subdir,
               "' subfolder");
  return system_dir;
}

TupleDatasetPair load_mnist_like(const MnistOptions& o, const char* subdir, const char* system_dir,
                                 const char* fn) {
  check_options(o, fn);
  const std::string dir = dataset_directory(o, subdir, system_dir, fn);
  // The test split loads on a second thread while this one loads the (six times larger) train
  // split.
  std::future<std::shared_ptr<TupleDataset>> test =
      std::async(std::launch::async, [&] { return load_split(dir, "t10k", o, fn); });
  auto train = load_split(dir, "train", o, fn);
  return {std::move(train), test.get()};
}

}  // namespace

Array read_idx(const std::string& path) {
  return read_idx_array(path, "read_idx", nullptr);
}

TupleDatasetPair get_mnist(const MnistOptions& options) {
  return load_mnist_like(options, "mnist", nullptr, "get_mnist");
}

TupleDatasetPair get_fashion_mnist(const MnistOptions& options) {
  return load_mnist_like(options, "fashion-mnist", "/usr/share/datasets/fashion-mnist",
                         "get_fashion_mnist");
}

}  // namespace kusari
