// Decoding and encoding JPEG (libjpeg-turbo's TurboJPEG API; windows through its jpeglib API) and
// PNG (libpng's simplified API).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "kusari/core/error.h"
#include "kusari/datasets/image.h"

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
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

TjHandle& decompressor_slot() {
  thread_local TjHandle handle;
  return handle;
}

tjhandle decompressor() {
  TjHandle& handle = decompressor_slot();
  if (!handle) handle.reset(tjInitDecompress());
  KUSARI_CHECK(handle != nullptr, Error,
               "decode_image: tjInitDecompress failed: ", tjGetErrorStr2(nullptr));
  return handle.get();
}

// Note [A fresh TurboJPEG handle after an error]
// TurboJPEG 2.1's tjDecompressHeader3 leaves its handle inside the header it failed to read
// (it skips jpeg_abort_decompress on the error path), and the next header read on that handle
// then fails on a good file ("SOS before SOF"): one damaged file would break every later file
// of a loader thread. So after any error the thread's handle is dropped and made anew. The
// error text is taken first (it lives in the handle).
std::string drop_decompressor(tjhandle tj) {
  std::string message = tjGetErrorStr2(tj);
  decompressor_slot().reset();
  return message;
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
                 " bytes): its header cannot be read: ", drop_decompressor(tj));
  }
  // A file that ends inside its markers passes with a warning and no frame.
  if (h.width <= 0 || h.height <= 0) {
    drop_decompressor(tj);
    KUSARI_THROW(IOError, fn, ": ", name, " is a truncated or damaged JPEG (", size,
                 " bytes): its header cannot be read: the data ends before a frame header");
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

// Note [Decoding a window of a JPEG]
// A random crop reads on average half of the picture, and a JPEG need not be decoded whole to
// give part of it. libjpeg's jpeglib API (TurboJPEG 2.x has no such call) decodes a window:
//   - rows above it: jpeg_skip_scanlines, which still reads their entropy-coded data (a baseline
//     JPEG has no index into it) but does no inverse DCT, upsampling or colour conversion;
//   - rows below it: never decoded (jpeg_abort_decompress);
//   - columns: jpeg_crop_scanline decodes only the iMCU columns that cover the window.
// The pixels are those of a full decode (the tests compare with plain jpeglib), with one caveat
// that libjpeg documents: its "fancy" chroma upsampling treats the left and right edges of a
// cropped row as the image's edges, so the outermost columns of a crop may differ. So the crop
// is widened by one iMCU on each side (where the image goes on) and cut down afterwards.
// Errors: a corrupt or truncated JPEG is an error wherever the damage is above or inside the
// window; damage below it is not seen by the decoder, so the data after the rows read must still
// hold an end-of-image marker (FF D9), which a truncated file has lost. Warnings (corrupt data
// that libjpeg can decode past) are errors, as in the full decode through TurboJPEG.

struct JpeglibError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  bool warning = false;
};

[[noreturn]] void jpeglib_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpeglibError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeglib_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpeglibError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  e->warning = true;
  std::longjmp(e->jump, 1);
}

// The decompressor of decode_jpeg_window; destroyed on every path (jpeg_destroy_decompress is
// safe after jpeg_create_decompress, also after an error).
struct JpeglibDecompressor {
  jpeg_decompress_struct cinfo;
  JpeglibError err;
  JpeglibDecompressor() {
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeglib_error_exit;
    err.mgr.emit_message = jpeglib_emit_message;
    jpeg_create_decompress(&cinfo);
  }
  ~JpeglibDecompressor() { jpeg_destroy_decompress(&cinfo); }
  JpeglibDecompressor(const JpeglibDecompressor&) = delete;
  JpeglibDecompressor& operator=(const JpeglibDecompressor&) = delete;
};

bool has_end_marker(const uint8_t* from, const uint8_t* end) {
  for (const uint8_t* p = from; p + 1 < end; ++p) {
    p = static_cast<const uint8_t*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p - 1)));
    if (p == nullptr) return false;
    if (p[1] == 0xD9) return true;
  }
  return false;
}

// The work of decode_jpeg_window_into between its setjmp and the end: libjpeg may longjmp out
// of it, so it owns nothing with a destructor. Returns null on success, else the reason.
const char* read_jpeg_window(jpeg_decompress_struct& cinfo, const uint8_t* data, size_t size,
                             const DecodeOptions& o, const PixelWindow& w, J_COLOR_SPACE space,
                             int channels, std::vector<uint8_t>& row,
                             std::vector<JSAMPROW>& rows, Image& out) {
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const uint8_t* scan_data = cinfo.src->next_input_byte;  // the first scan's entropy-coded data
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(o.scale_denom);
  cinfo.out_color_space = space;
  jpeg_start_decompress(&cinfo);
  const auto full_width = static_cast<int64_t>(cinfo.output_width);
  const auto full_height = static_cast<int64_t>(cinfo.output_height);
  if (w.top + w.height > full_height || w.left + w.width > full_width) return "bad window";
  // One iMCU of margin on each side (Note [Decoding a window of a JPEG]).
#if JPEG_LIB_VERSION >= 70  // the libjpeg 7/8 API (a libjpeg-turbo built with --with-jpeg8) splits it by axis
  const int64_t dct_width = cinfo.min_DCT_h_scaled_size;
#else
  const int64_t dct_width = cinfo.min_DCT_scaled_size;
#endif
  const int64_t margin = int64_t{cinfo.max_h_samp_factor} * dct_width;
  const int64_t x0 = std::max<int64_t>(0, w.left - margin);
  const int64_t x1 = std::min(full_width, w.left + w.width + margin);
  auto xoffset = static_cast<JDIMENSION>(x0);
  auto xwidth = static_cast<JDIMENSION>(x1 - x0);
  if (xwidth < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoffset, &xwidth);
  if (w.top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(w.top));
  const int64_t stride = int64_t{cinfo.output_width} * channels;
  const int64_t cut = (w.left - static_cast<int64_t>(xoffset)) * channels;
  const int64_t keep = w.width * channels;
  row.resize(static_cast<size_t>(stride) * cinfo.rec_outbuf_height);
  rows.resize(static_cast<size_t>(cinfo.rec_outbuf_height));
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = row.data() + r * static_cast<size_t>(stride);
  for (int64_t y = 0; y < w.height;) {
    const auto want = static_cast<JDIMENSION>(
        std::min<int64_t>(w.height - y, static_cast<int64_t>(rows.size())));
    const JDIMENSION got = jpeg_read_scanlines(&cinfo, rows.data(), want);
    if (got == 0) return "no more scanlines";
    for (JDIMENSION r = 0; r < got; ++r, ++y) {
      std::memcpy(out.pixels.data() + y * keep, rows[r] + cut, static_cast<size_t>(keep));
    }
  }
  if (w.top + w.height < full_height && !has_end_marker(scan_data, data + size)) {
    return "the data ends before the end-of-image marker";
  }
  jpeg_abort_decompress(&cinfo);
  return nullptr;
}

// Decodes `w` of the JPEG at 1/o.scale_denom into `out` (w.height x w.width x channels of the
// colour space `space`). Returns an empty string on success, else the error text; `*warning`
// tells a truncated or damaged file from a corrupt one.
std::string decode_jpeg_window_into(const uint8_t* data, size_t size, const DecodeOptions& o,
                                    const PixelWindow& w, J_COLOR_SPACE space, int channels,
                                    Image& out, bool* warning) {
  JpeglibDecompressor d;
  std::vector<uint8_t> row;
  std::vector<JSAMPROW> rows;
  if (setjmp(d.err.jump) != 0) {
    *warning = d.err.warning;
    return d.err.message;
  }
  const char* failed = read_jpeg_window(d.cinfo, data, size, o, w, space, channels, row, rows, out);
  if (failed == nullptr) return std::string();
  *warning = true;
  return failed;
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
  const bool whole = !o.window || (o.window->top == 0 && o.window->left == 0 &&
                                   o.window->height == ht && o.window->width == w);
  Image img;
  if (whole) {
    img = Image::zeros(ht, w, decoded_channels);
    tjhandle tj = decompressor();
    if (tjDecompress2(tj, data, static_cast<unsigned long>(size), img.pixels.data(), w, 0, ht,
                      pixel_format, 0) != 0) {
      const bool warning = tjGetErrorCode(tj) == TJERR_WARNING;
      KUSARI_THROW(IOError, fn, ": ", name, " is a ", warning ? "truncated or damaged" : "corrupt",
                   " JPEG (", h.width, "x", h.height, ", ", size, " bytes): ", drop_decompressor(tj));
    }
  } else {
    const PixelWindow& win = *o.window;
    img = Image::zeros(win.height, win.width, decoded_channels);
    const J_COLOR_SPACE space = pixel_format == TJPF_CMYK   ? JCS_CMYK
                                : pixel_format == TJPF_GRAY ? JCS_GRAYSCALE
                                                            : JCS_RGB;
    bool warning = false;
    const std::string error =
        decode_jpeg_window_into(data, size, o, win, space, decoded_channels, img, &warning);
    KUSARI_CHECK(error.empty(), IOError, fn, ": ", name, " is a ",
                 warning ? "truncated or damaged" : "corrupt", " JPEG (", h.width, "x", h.height,
                 ", ", size, " bytes): ", error);
  }
  if (stored != 4) return img;
  // CMYK -> RGB (Note [Colour conversions]).
  const bool inverted = has_adobe_marker(data, size);
  Image rgb = Image::zeros(img.height, img.width, 3);
  const int64_t n = img.height * img.width;
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
    std::rewind(f.get());
    if (n > 0) {  // a regular file: straight into the buffer
      bytes.resize(static_cast<size_t>(n));
      const size_t got = std::fread(bytes.data(), 1, bytes.size(), f.get());
      KUSARI_CHECK(!std::ferror(f.get()), IOError, "read_file_bytes: cannot read ", path, ": ",
                   std::strerror(errno));
      bytes.resize(got);
      if (got < static_cast<size_t>(n)) return bytes;  // (it shrank meanwhile)
      // The loop below appends whatever was added since.
    }
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
  if (options.window) {
    const ImageInfo info = read_image_info(data, size, name);
    const int64_t d = format == ImageFormat::kJpeg ? options.scale_denom : 1;
    const int64_t height = (info.height + d - 1) / d, width = (info.width + d - 1) / d;
    const PixelWindow& w = *options.window;
    KUSARI_CHECK(w.top >= 0 && w.left >= 0 && w.height > 0 && w.width > 0 &&
                     w.top + w.height <= height && w.left + w.width <= width,
                 ValueError, fn, ": decoding ", name, ": the window (top ", w.top, ", left ",
                 w.left, ", ", w.height, "x", w.width, ") does not lie inside the ", height, "x",
                 width, " image", d > 1 ? detail::concat(" (1/", d, " of ", info.height, "x",
                                                         info.width, ")")
                                        : std::string());
  }
  if (format == ImageFormat::kJpeg) return decode_jpeg(data, size, name, options, fn);
  Image img = decode_png(data, size, name, options, fn);
  if (!options.window) return img;
  const PixelWindow& w = *options.window;
  Image cut = Image::zeros(w.height, w.width, img.channels);
  const auto row = static_cast<size_t>(w.width * img.channels);
  for (int64_t y = 0; y < w.height; ++y) {
    std::memcpy(&cut.pixels[static_cast<size_t>(y) * row],
                &img.pixels[static_cast<size_t>(((w.top + y) * img.width + w.left) * img.channels)],
                row);
  }
  return cut;
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
