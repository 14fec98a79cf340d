// Decoding and encoding JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng's simplified API).
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "kusari/core/error.h"
#include "kusari/datasets/image.h"

#include <png.h>
#include <turbojpeg.h>

namespace kusari {
namespace {

namespace fs = std::filesystem;

// Note [Colour conversions]
// Every decoder hands back what the file stores (grey, RGB, RGBA or CMYK) and one set of rules
// turns it into the channels asked for, so JPEG and PNG agree:
//  - grey -> RGB replicates the value; RGB -> grey is ITU-R BT.601 luma
//    (299 R + 587 G + 114 B + 500) / 1000, the formula of PIL's convert("L"). A JPEG in YCbCr asked
//    for grey is decoded straight to its Y plane by libjpeg, which is the same luma.
//  - alpha is dropped (not composited), as PIL's convert("RGB") does.
//  - CMYK (JPEG only) -> RGB is R = (255 - C)(255 - K) / 255, and so on. A CMYK JPEG carrying an
//    Adobe APP14 marker stores inverted values (Photoshop's convention, which PIL follows too),
//    so there R = C' K' / 255 for the stored C', K'.

std::string format_bytes(const uint8_t* data, size_t size) {
  std::string out;
  char buf[8];
  for (size_t i = 0; i < size && i < 8; ++i) {
    std::snprintf(buf, sizeof(buf), i == 0 ? "%02X" : " %02X", data[i]);
    out += buf;
  }
  return out;
}

ImageFormat detect_format(const uint8_t* data, size_t size) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

void check_not_empty_and_known(const uint8_t* data, size_t size, const std::string& name,
                               const char* fn, ImageFormat format) {
  KUSARI_CHECK(size > 0, IOError, fn, ": ", name,
               " is empty (0 bytes), expected a JPEG or PNG image");
  KUSARI_CHECK(format != ImageFormat::kUnknown, IOError, fn, ": ", name,
               " is not a JPEG or PNG image: it starts with bytes ", format_bytes(data, size),
               " (JPEG starts with FF D8 FF, PNG with 89 50 4E 47 0D 0A 1A 0A)");
}

// One TurboJPEG handle per thread and direction: creating one allocates a few kilobytes, and a
// handle must not be used by two threads at once.
struct TjDeleter {
  void operator()(void* h) const {
    if (h != nullptr) tjDestroy(h);
  }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

tjhandle decompressor() {
  thread_local TjHandle handle(tjInitDecompress());
  KUSARI_CHECK(handle != nullptr, Error,
               "decode_image: tjInitDecompress failed: ", tjGetErrorStr2(nullptr));
  return handle.get();
}

tjhandle compressor() {
  thread_local TjHandle handle(tjInitCompress());
  KUSARI_CHECK(handle != nullptr, Error,
               "encode_jpeg: tjInitCompress failed: ", tjGetErrorStr2(nullptr));
  return handle.get();
}

// True when the JPEG has an Adobe APP14 marker before its first scan; see Note [Colour
// conversions].
bool has_adobe_marker(const uint8_t* data, size_t size) {
  size_t p = 2;
  while (p + 4 <= size) {
    if (data[p] != 0xFF) return false;
    const uint8_t marker = data[p + 1];
    if (marker == 0xFF) {  // fill byte
      ++p;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return false;  // start of scan / end of image
    const size_t len = (size_t{data[p + 2]} << 8) | data[p + 3];
    if (len < 2) return false;
    if (marker == 0xEE && p + 4 + 5 <= size && std::memcmp(data + p + 4, "Adobe", 5) == 0)
      return true;
    p += 2 + len;
  }
  return false;
}

struct JpegHeader {
  int width = 0;
  int height = 0;
  int subsamp = 0;
  int colorspace = 0;
};

JpegHeader read_jpeg_header(const uint8_t* data, size_t size, const std::string& name,
                            const char* fn) {
  JpegHeader h;
  tjhandle tj = decompressor();
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), &h.width, &h.height,
                          &h.subsamp, &h.colorspace) != 0) {
    KUSARI_THROW(IOError, fn, ": ", name, " is a corrupt JPEG (", size,
                 " bytes): its header cannot be read: ", tjGetErrorStr2(tj));
  }
  return h;
}

int stored_jpeg_channels(int colorspace) {
  if (colorspace == TJCS_GRAY) return 1;
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) return 4;
  return 3;
}

uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
}

// Converts `src` (stored channels: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) into `want` channels
// (1 or 3) following Note [Colour conversions].
Image convert_channels(Image src, int want) {
  const int64_t have = src.channels;
  if (have == want) return src;
  Image out = Image::zeros(src.height, src.width, want);
  const int64_t n = src.height * src.width;
  const uint8_t* s = src.pixels.data();
  uint8_t* d = out.pixels.data();
  for (int64_t i = 0; i < n; ++i, s += have) {
    if (want == 1) {
      d[i] = have <= 2 ? s[0] : luma(s[0], s[1], s[2]);
    } else {
      const bool grey = have <= 2;
      d[3 * i] = s[0];
      d[3 * i + 1] = grey ? s[0] : s[1];
      d[3 * i + 2] = grey ? s[0] : s[2];
    }
  }
  return out;
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& o,
                  const char* fn) {
  const JpegHeader h = read_jpeg_header(data, size, name, fn);
  tjscalingfactor sf{1, o.scale_denom};
  const int w = TJSCALED(h.width, sf);
  const int ht = TJSCALED(h.height, sf);
  const int stored = stored_jpeg_channels(h.colorspace);
  int want = o.channels == 0 ? (stored == 1 ? 1 : 3) : o.channels;
  int pixel_format = want == 1 ? TJPF_GRAY : TJPF_RGB;
  int decoded_channels = want;
  if (stored == 4) {  // libjpeg converts no CMYK to RGB: decode CMYK and convert here
    pixel_format = TJPF_CMYK;
    decoded_channels = 4;
  }
  Image img = Image::zeros(ht, w, decoded_channels);
  tjhandle tj = decompressor();
  if (tjDecompress2(tj, data, static_cast<unsigned long>(size), img.pixels.data(), w, 0, ht,
                    pixel_format, 0) != 0) {
    const bool warning = tjGetErrorCode(tj) == TJERR_WARNING;
    KUSARI_THROW(IOError, fn, ": ", name, " is a ", warning ? "truncated or damaged" : "corrupt",
                 " JPEG (", h.width, "x", h.height, ", ", size, " bytes): ", tjGetErrorStr2(tj));
  }
  if (stored != 4) return img;
  // CMYK -> RGB (Note [Colour conversions]).
  const bool inverted = has_adobe_marker(data, size);
  Image rgb = Image::zeros(ht, w, 3);
  const int64_t n = int64_t{ht} * w;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* s = &img.pixels[static_cast<size_t>(4 * i)];
    const int k = inverted ? s[3] : 255 - s[3];
    for (int c = 0; c < 3; ++c) {
      const int v = inverted ? s[c] : 255 - s[c];
      rgb.pixels[static_cast<size_t>(3 * i + c)] = static_cast<uint8_t>((v * k + 127) / 255);
    }
  }
  return want == 1 ? convert_channels(std::move(rgb), 1) : rgb;
}

struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
};

Image decode_png(const uint8_t* data, size_t size, const std::string& name, const DecodeOptions& o,
                 const char* fn) {
  PngImage p;
  if (png_image_begin_read_from_memory(&p.image, data, size) == 0) {
    KUSARI_THROW(IOError, fn, ": ", name, " is a corrupt PNG (", size,
                 " bytes): ", p.image.message);
  }
  const bool colour = (p.image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (p.image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const int stored = (colour ? 3 : 1) + (alpha ? 1 : 0);
  p.image.format = colour ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB)
                          : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  Image img = Image::zeros(p.image.height, p.image.width, stored);
  if (png_image_finish_read(&p.image, nullptr, img.pixels.data(), 0, nullptr) == 0) {
    KUSARI_THROW(IOError, fn, ": ", name, " is a truncated or corrupt PNG (", p.image.width, "x",
                 p.image.height, ", ", size, " bytes): ", p.image.message);
  }
  const int want = o.channels == 0 ? (colour ? 3 : 1) : o.channels;
  return convert_channels(std::move(img), want);
}

void check_decode_options(const DecodeOptions& o, const std::string& name, const char* fn) {
  KUSARI_CHECK(o.channels == 0 || o.channels == 1 || o.channels == 3, ValueError, fn, ": decoding ",
               name, ": channels must be 0 (as stored), 1 (grey) or 3 (RGB), got ", o.channels);
  KUSARI_CHECK(o.scale_denom == 1 || o.scale_denom == 2 || o.scale_denom == 4 || o.scale_denom == 8,
               ValueError, fn, ": decoding ", name, ": scale_denom must be 1, 2, 4 or 8, got ",
               o.scale_denom);
}

void check_encodable(const Image& image, const char* fn, bool allow_alpha) {
  KUSARI_CHECK(!image.is_float, DtypeError, fn,
               ": the image holds float values; encode uint8 pixels");
  KUSARI_CHECK(!image.planar, ValueError, fn, ": the image is planar (CHW); encode an HWC image");
  KUSARI_CHECK(image.channels == 1 || image.channels == 3 || (allow_alpha && image.channels == 4),
               ValueError, fn, ": cannot encode an image of ", image.channels,
               " channels (expected 1 or 3", allow_alpha ? " or 4)" : ")");
  KUSARI_CHECK(image.height > 0 && image.width > 0, ValueError, fn,
               ": cannot encode an empty image (", image.height, "x", image.width, ")");
  KUSARI_CHECK(static_cast<int64_t>(image.pixels.size()) == image.size(), ValueError, fn,
               ": the image says ", image.height, "x", image.width, "x", image.channels,
               " but holds ", image.pixels.size(), " bytes");
}

}  // namespace

Image Image::zeros(int64_t height, int64_t width, int64_t channels) {
  Image img;
  img.height = height;
  img.width = width;
  img.channels = channels;
  img.pixels.assign(static_cast<size_t>(height * width * channels), 0);
  return img;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  KUSARI_CHECK(!fs::is_directory(path, ec), IOError, "read_file_bytes: ", path,
               " is a directory, expected a file");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  KUSARI_CHECK(f != nullptr, IOError, "read_file_bytes: cannot open ", path, ": ",
               std::strerror(errno));
  std::vector<uint8_t> bytes;
  if (std::fseek(f.get(), 0, SEEK_END) == 0) {
    const long n = std::ftell(f.get());
    if (n > 0) bytes.reserve(static_cast<size_t>(n));
    std::rewind(f.get());
  }
  uint8_t buf[1 << 16];
  while (true) {
    const size_t got = std::fread(buf, 1, sizeof(buf), f.get());
    bytes.insert(bytes.end(), buf, buf + got);
    if (got < sizeof(buf)) {
      KUSARI_CHECK(!std::ferror(f.get()), IOError, "read_file_bytes: cannot read ", path, ": ",
                   std::strerror(errno));
      break;
    }
  }
  return bytes;
}

ImageInfo read_image_info(const uint8_t* data, size_t size, const std::string& name) {
  const char* fn = "read_image_info";
  ImageInfo info;
  info.format = detect_format(data, size);
  check_not_empty_and_known(data, size, name, fn, info.format);
  if (info.format == ImageFormat::kJpeg) {
    const JpegHeader h = read_jpeg_header(data, size, name, fn);
    info.height = h.height;
    info.width = h.width;
    info.channels = stored_jpeg_channels(h.colorspace);
    return info;
  }
  PngImage p;
  if (png_image_begin_read_from_memory(&p.image, data, size) == 0) {
    KUSARI_THROW(IOError, fn, ": ", name, " is a corrupt PNG (", size,
                 " bytes): ", p.image.message);
  }
  info.height = p.image.height;
  info.width = p.image.width;
  info.channels = PNG_IMAGE_SAMPLE_CHANNELS(p.image.format);
  return info;
}

Image decode_image(const uint8_t* data, size_t size, const std::string& name,
                   const DecodeOptions& options) {
  const char* fn = "decode_image";
  check_decode_options(options, name, fn);
  const ImageFormat format = detect_format(data, size);
  check_not_empty_and_known(data, size, name, fn, format);
  if (format == ImageFormat::kJpeg) return decode_jpeg(data, size, name, options, fn);
  return decode_png(data, size, name, options, fn);
}

Image decode_image(const std::string& path, const DecodeOptions& options) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path, options);
}

int jpeg_scale_denom_for(int64_t crop_height, int64_t crop_width, int64_t out_height,
                         int64_t out_width) {
  for (int d : {8, 4, 2}) {
    if ((crop_height + d - 1) / d >= out_height && (crop_width + d - 1) / d >= out_width) return d;
  }
  return 1;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  const char* fn = "encode_jpeg";
  check_encodable(image, fn, false);
  KUSARI_CHECK(quality >= 1 && quality <= 100, ValueError, fn, ": quality must be in 1..100, got ",
               quality);
  tjhandle tj = compressor();
  unsigned char* buf = nullptr;
  unsigned long n = 0;
  const bool grey = image.channels == 1;
  if (tjCompress2(tj, image.pixels.data(), static_cast<int>(image.width), 0,
                  static_cast<int>(image.height), grey ? TJPF_GRAY : TJPF_RGB, &buf, &n,
                  grey ? TJSAMP_GRAY : TJSAMP_420, quality, 0) != 0) {
    if (buf != nullptr) tjFree(buf);
    KUSARI_THROW(Error, fn, ": compressing a ", image.height, "x", image.width, "x", image.channels,
                 " image failed: ", tjGetErrorStr2(tj));
  }
  std::vector<uint8_t> out(buf, buf + n);
  tjFree(buf);
  return out;
}

std::vector<uint8_t> encode_png(const Image& image) {
  const char* fn = "encode_png";
  check_encodable(image, fn, true);
  PngImage p;
  p.image.width = static_cast<png_uint_32>(image.width);
  p.image.height = static_cast<png_uint_32>(image.height);
  p.image.format = image.channels == 1   ? PNG_FORMAT_GRAY
                   : image.channels == 3 ? PNG_FORMAT_RGB
                                         : PNG_FORMAT_RGBA;
  png_alloc_size_t n = 0;
  if (png_image_write_to_memory(&p.image, nullptr, &n, 0, image.pixels.data(), 0, nullptr) == 0) {
    KUSARI_THROW(Error, fn, ": sizing the PNG failed: ", p.image.message);
  }
  std::vector<uint8_t> out(n);
  if (png_image_write_to_memory(&p.image, out.data(), &n, 0, image.pixels.data(), 0, nullptr) ==
      0) {
    KUSARI_THROW(Error, fn, ": writing the PNG failed: ", p.image.message);
  }
  out.resize(n);
  return out;
}

void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  const char* fn = "write_file_bytes";
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  KUSARI_CHECK(f != nullptr, IOError, fn, ": cannot create ", tmp, " (to be renamed to ", path,
               "): ", std::strerror(errno));
  const size_t written = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != bytes.size() || !closed) {
    std::remove(tmp.c_str());
    KUSARI_THROW(IOError, fn, ": cannot write ", bytes.size(), " bytes to ", tmp, ": ",
                 std::strerror(write_errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    KUSARI_THROW(IOError, fn, ": cannot rename ", tmp, " to ", path, ": ", ec.message());
  }
}

void write_jpeg(const std::string& path, const Image& image, int quality) {
  write_file_bytes(path, encode_jpeg(image, quality));
}

void write_png(const std::string& path, const Image& image) {
  write_file_bytes(path, encode_png(image));
}

Array image_to_array(const Image& image) {
  const Shape shape = image.planar ? Shape{image.channels, image.height, image.width}
                                   : Shape{image.height, image.width, image.channels};
  if (image.is_float) return Array::from_buffer(image.values.data(), shape, float32, Device::cpu());
  return Array::from_buffer(image.pixels.data(), shape, uint8, Device::cpu());
}

Image image_from_array(const Array& array) {
  KUSARI_CHECK(array.dtype() == uint8, DtypeError, "image_from_array: expected a uint8 array, got ",
               dtype_name(array.dtype()));
  KUSARI_CHECK(array.ndim() == 2 || array.ndim() == 3, ShapeError,
               "image_from_array: expected an (H, W) or (H, W, C) array, got shape ",
               array.shape());
  Array a = array.to_device(Device::cpu()).contiguous();
  Image img = Image::zeros(a.shape()[0], a.shape()[1], a.ndim() == 3 ? a.shape()[2] : 1);
  if (img.size() > 0) std::memcpy(img.pixels.data(), a.raw_data(), static_cast<size_t>(img.size()));
  return img;
}

}  // namespace kusari
