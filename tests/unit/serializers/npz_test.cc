// Tests of the npz serializers: NPY/ZIP encoding, NumPy interoperability in both directions
// (through /usr/bin/python3 with NumPy: the tests fail, never skip, without it), corruption
// handling, atomic replacement, and the Serializer protocol on links and optimizer-like objects.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/routines.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/optimizers/optimizer.h"
#include "kusari/serializers/npz.h"
#include "serializers/file_io.h"
#include "serializers/npz_internal.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace fs = std::filesystem;
using testing::ArraysClose;

// --- helpers
// ----------------------------------------------------------------------------------------

// The interpreter with NumPy; KUSARI_TEST_PYTHON overrides it.
std::string python() {
  const char* env = std::getenv("KUSARI_TEST_PYTHON");
  return env && *env ? env : "/usr/bin/python3";
}

class NpzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "kusari_npz_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << "cannot create a temporary directory";
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // Runs a Python script (with numpy imported as np) and returns its exit status.
  int run_python(const std::string& body) {
    const std::string script = file("script_" + std::to_string(script_count_++) + ".py");
    {
      std::ofstream out(script);
      out << "import sys\nimport numpy as np\n" << body << "\n";
    }
    const std::string cmd = python() + " " + script + " 2>&1";
    const int status = std::system(cmd.c_str());
    fs::remove(script);
    return status == -1 ? -1 : WEXITSTATUS(status);
  }

  // Runs a script that must succeed; the test fails when Python or NumPy is missing.
  void python_ok(const std::string& body) {
    ASSERT_EQ(run_python(""), 0)
        << python() << " with NumPy is required by this test (set KUSARI_TEST_PYTHON to "
        << "an interpreter that has NumPy)";
    ASSERT_EQ(run_python(body), 0) << "the Python check failed:\n" << body;
  }

  // The names in the test directory (to check that no temporary file is left behind).
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  static void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  fs::path dir_;
  int script_count_ = 0;
};

// Expects `f` to throw kusari::IOError whose message contains every one of `parts`.
template <typename F>
void expect_io_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kusari::IOError";
  } catch (const IOError& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

const Array* find(const NamedArrays& arrays, const std::string& key) {
  for (const auto& [k, a] : arrays) {
    if (k == key) return &a;
  }
  return nullptr;
}

std::vector<std::string> keys_of(const NamedArrays& arrays) {
  std::vector<std::string> keys;
  for (const auto& [k, a] : arrays) keys.push_back(k);
  return keys;
}

// Bytes of a host array in C order.
std::string bytes_of(const Array& a) {
  Array c = a.to_device(Device::cpu()).contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.nbytes()));
}

// An array of `shape` and `dtype` with varied values (exactly representable in every dtype).
Array sample(const Shape& shape, Dtype dtype, double offset = 0.0) {
  Array a = Array::arange(0.0, static_cast<double>(shape.numel()), 1.0, float64, Device::cpu());
  if (dtype == bool_)
    return (a - 2.0 * floor(a * 0.5)).astype(bool_).reshape(shape);  // 0 1 0 1 ...
  return ((a - 3.0) * 0.5 + offset).astype(dtype).reshape(shape);
}

Array sample_any(const Shape& shape, Dtype dtype) {
  if (dtype == uint8) {
    Array a = Array::arange(0.0, static_cast<double>(shape.numel()), 1.0, float64, Device::cpu());
    return (a * 7.0 - 256.0 * floor(a * 7.0 / 256.0)).astype(uint8).reshape(shape);
  }
  if (dtype == int32 || dtype == int64) {
    Array a = Array::arange(0.0, static_cast<double>(shape.numel()), 1.0, float64, Device::cpu());
    return (a * 1000003.0 - 5000.0).astype(dtype).reshape(shape);
  }
  return sample(shape, dtype);
}

// --- round trips
// -------------------------------------------------------------------------------------

class NpzRoundTripTest : public NpzTest, public ::testing::WithParamInterface<bool> {};

TEST_P(NpzRoundTripTest, EveryDtypeAndShape) {
  const bool compress = GetParam();
  const std::vector<Dtype> dtypes{bool_, uint8, int32, int64, float16, float32, float64};
  const std::vector<Shape> shapes{{},     {0},       {1},       {5},
                                  {2, 3}, {3, 0, 2}, {2, 3, 4}, {1, 1, 1, 1, 1, 1, 1, 2}};
  NamedArrays arrays;
  for (Dtype d : dtypes) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      arrays.emplace_back(std::string(dtype_name(d)) + "/" + std::to_string(i),
                          sample_any(shapes[i], d));
    }
  }
  // A non-contiguous view is written in C order of its elements.
  arrays.emplace_back("transposed", sample_any({3, 4}, float32).transpose());
  const std::string path = file("all.npz");
  write_npz(path, arrays, compress);
  NamedArrays back = read_npz(path);
  ASSERT_EQ(keys_of(back), keys_of(arrays));
  for (size_t i = 0; i < arrays.size(); ++i) {
    SCOPED_TRACE(arrays[i].first);
    EXPECT_EQ(back[i].second.dtype(), arrays[i].second.dtype());
    EXPECT_EQ(back[i].second.shape(), arrays[i].second.shape());
    EXPECT_EQ(back[i].second.device(), Device::cpu());
    EXPECT_TRUE(back[i].second.is_contiguous());
    EXPECT_EQ(bytes_of(back[i].second), bytes_of(arrays[i].second));
  }
}

TEST_P(NpzRoundTripTest, SpecialFloatValuesSurvive) {
  const double inf = std::numeric_limits<double>::infinity();
  Array a = Array::from_vector(
      std::vector<double>{0.0, -0.0, inf, -inf, std::nan(""), 1e-310, 1.7976931348623157e308});
  const std::string path = file("special.npz");
  write_npz(path, {{"a", a}, {"h", a.astype(float16)}}, GetParam());
  NamedArrays back = read_npz(path);
  EXPECT_EQ(bytes_of(back[0].second), bytes_of(a));
  EXPECT_EQ(bytes_of(back[1].second), bytes_of(a.astype(float16)));
}

INSTANTIATE_TEST_SUITE_P(Compression, NpzRoundTripTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "compressed" : "stored";
                         });

TEST_F(NpzTest, BFloat16IsStoredAsFloat32) {
  Array a = Array::from({1.5, -2.25, 1024.0, 0.0078125}, Shape{2, 2}, bfloat16, Device::cpu());
  const std::string path = file("bf16.npz");
  write_npz(path, {{"a", a}});
  NamedArrays back = read_npz(path);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].second.dtype(), float32);
  EXPECT_TRUE(ArraysClose(back[0].second, a.astype(float32), 0.0, 0.0));
  // Loading into a bfloat16 array restores it exactly.
  Array target = Array::zeros({2, 2}, bfloat16, Device::cpu());
  NpzDeserializer d(back);
  d("a", target);
  EXPECT_EQ(target.dtype(), bfloat16);
  EXPECT_EQ(bytes_of(target), bytes_of(a));
  python_ok("f = np.load(r'" + path +
            "')\nassert f['a'].dtype == np.float32, f['a'].dtype\n"
            "assert f['a'].tolist() == [[1.5, -2.25], [1024.0, 0.0078125]], f['a'].tolist()");
}

TEST_F(NpzTest, NpyRoundTripAndNumpyInterop) {
  const std::string path = file("one.npy");
  Array a = sample_any({3, 2}, int64);
  write_npy(path, a);
  Array back = read_npy(path);
  EXPECT_EQ(back.dtype(), int64);
  EXPECT_EQ(bytes_of(back), bytes_of(a));
  python_ok("a = np.load(r'" + path +
            "')\nassert a.dtype == np.int64 and a.shape == (3, 2)\n"
            "assert (a.ravel() == np.arange(6) * 1000003 - 5000).all(), a\n"
            "np.save(r'" +
            file("np.npy") + "', np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))");
  Array f = read_npy(file("np.npy"));
  EXPECT_TRUE(ArraysClose(f, Array::arange(0.0, 6.0, 1.0, float32, Device::cpu()).reshape({2, 3}),
                          0.0, 0.0));
  expect_io_error([&] { read_npz(file("np.npy")); },
                  {"read_npz", "np.npy", "is not a valid npz", "read_npy"});
}

TEST_F(NpzTest, OutputIsDeterministic) {
  NamedArrays arrays{{"x", sample({4, 5}, float32)}, {"y", sample_any({7}, int32)}};
  write_npz(file("a.npz"), arrays);
  write_npz(file("b.npz"), arrays);
  EXPECT_EQ(read_bytes(file("a.npz")), read_bytes(file("b.npz")));
}

TEST_F(NpzTest, NoArraysIsAnEmptyArchive) {
  const std::string path = file("empty.npz");
  write_npz(path, {});
  EXPECT_EQ(read_bytes(path).size(), 22u) << "the end-of-central-directory record alone";
  EXPECT_TRUE(read_npz(path).empty());
  python_ok("f = np.load(r'" + path + "')\nassert f.files == [], f.files\n");
  EXPECT_EQ(listing(), std::vector<std::string>{"empty.npz"});
}

TEST_F(NpzTest, WriteRejectsBadArguments) {
  const std::string path = file("bad.npz");
  EXPECT_THROW(write_npz(path, {{"a", sample({2}, float32)}, {"a", sample({2}, float32)}}),
               ValueError);
  EXPECT_THROW(write_npz(path, {{"", sample({2}, float32)}}), ValueError);
  EXPECT_THROW(write_npz(path, {{"u", Array()}}), ValueError);
  EXPECT_TRUE(listing().empty());
}

// --- NumPy interoperability
// ----------------------------------------------------------------------------

class NumpyInteropTest : public NpzTest, public ::testing::WithParamInterface<bool> {};

TEST_P(NumpyInteropTest, ReadsFilesWrittenByNumpy) {
  const std::string path = file("numpy.npz");
  const std::string save = GetParam() ? "np.savez_compressed" : "np.savez";
  python_ok(save + "(r'" + path +
            "', **{\n"
            "  'f32': np.arange(6, dtype=np.float32).reshape(2, 3) / 4,\n"
            "  'fortran': np.asfortranarray(np.arange(24, dtype=np.float64).reshape(2, 3, 4)),\n"
            "  'mask': np.array([[True, False, True], [False, False, True]]),\n"
            "  'l1/W': np.array([[1, -2], [3, -4]], dtype=np.float32),\n"
            "  'scalar': np.float64(2.5),\n"
            "  'count': np.int64(-7),\n"
            "  'empty': np.zeros((0, 3), dtype=np.float32),\n"
            "  'f16': np.array([0.5, -1.0, 65504.0], dtype=np.float16),\n"
            "  'u1': np.array([0, 255, 7], dtype=np.uint8),\n"
            "  'i1': np.array([-128, 127, 0], dtype=np.int8),\n"
            "  'i2': np.array([-32768, 32767], dtype=np.int16),\n"
            "  'u2': np.array([65535, 1], dtype=np.uint16),\n"
            "  'i4': np.array([-2147483648, 2147483647], dtype=np.int32),\n"
            "  'u4': np.array([4294967295, 0], dtype=np.uint32),\n"
            "  'i8': np.array([-(2**63), 2**63 - 1], dtype=np.int64),\n"
            "  'big': np.arange(4, dtype='>f8').reshape(2, 2),\n"
            "  'bigi': np.array([1, -2], dtype='>i4'),\n"
            "  'text': np.asarray('h\\u00e9llo \\u732b'),\n"
            "  'raw': np.asarray(b'abc'),\n"
            "})");
  NamedArrays arrays = read_npz(path);
  auto get = [&](const std::string& key) -> const Array& {
    const Array* a = find(arrays, key);
    EXPECT_NE(a, nullptr) << "missing " << key;
    static const Array none;
    return a ? *a : none;
  };
  EXPECT_EQ(get("f32").dtype(), float32);
  EXPECT_TRUE(
      ArraysClose(get("f32"), Array::from({0, 0.25, 0.5, 0.75, 1, 1.25}, Shape{2, 3}), 0, 0));
  const Array& fo = get("fortran");
  EXPECT_EQ(fo.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(fo.is_contiguous());
  EXPECT_TRUE(ArraysClose(
      fo, Array::arange(0.0, 24.0, 1.0, float64, Device::cpu()).reshape({2, 3, 4}), 0, 0));
  EXPECT_EQ(get("mask").dtype(), bool_);
  EXPECT_EQ(get("mask").to_vector<bool>(),
            (std::vector<bool>{true, false, true, false, false, true}));
  EXPECT_EQ(get("mask").shape(), (Shape{2, 3}));
  EXPECT_TRUE(ArraysClose(get("l1/W"), Array::from({1, -2, 3, -4}, Shape{2, 2}), 0, 0));
  EXPECT_EQ(get("scalar").ndim(), 0);
  EXPECT_EQ(get("scalar").item<double>(), 2.5);
  EXPECT_EQ(get("count").dtype(), int64);
  EXPECT_EQ(get("count").item<int64_t>(), -7);
  EXPECT_EQ(get("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(get("f16").dtype(), float16);
  EXPECT_EQ(get("f16").to_vector<double>(), (std::vector<double>{0.5, -1.0, 65504.0}));
  EXPECT_EQ(get("u1").to_vector<int64_t>(), (std::vector<int64_t>{0, 255, 7}));
  EXPECT_EQ(get("i1").dtype(), int32);
  EXPECT_EQ(get("i1").to_vector<int64_t>(), (std::vector<int64_t>{-128, 127, 0}));
  EXPECT_EQ(get("i2").to_vector<int64_t>(), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(get("u2").dtype(), int32);
  EXPECT_EQ(get("u2").to_vector<int64_t>(), (std::vector<int64_t>{65535, 1}));
  EXPECT_EQ(get("i4").to_vector<int64_t>(), (std::vector<int64_t>{-2147483648LL, 2147483647LL}));
  EXPECT_EQ(get("u4").dtype(), int64);
  EXPECT_EQ(get("u4").to_vector<int64_t>(), (std::vector<int64_t>{4294967295LL, 0}));
  EXPECT_EQ(get("i8").to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(get("big").dtype(), float64);
  EXPECT_EQ(get("big").to_vector<double>(), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(get("bigi").to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
  // Strings (how Chainer stores a str) become their UTF-8 bytes, as kusari's Serializer stores
  // them.
  NpzDeserializer strings(arrays);
  std::string text;
  strings("text", text);
  EXPECT_EQ(text, "h\xc3\xa9llo \xe7\x8c\xab");
  std::string raw;
  strings("raw", raw);
  EXPECT_EQ(raw, "abc");
}

TEST_P(NumpyInteropTest, NumpyReadsOurFiles) {
  const std::string path = file("ours.npz");
  NamedArrays arrays{
      {"f32", Array::from({0.5, -1.5, 2.0, 3.25, 4, 5}, Shape{2, 3})},
      {"f64", Array::from({1e300, -1e-300}, std::nullopt, float64)},
      {"f16", Array::from({0.5, -2.0}, std::nullopt, float16)},
      {"bf16", Array::from({1.5, -0.25}, std::nullopt, bfloat16)},
      {"i32", Array::from_vector(std::vector<int32_t>{-2147483647 - 1, 2147483647})},
      {"i64", Array::from_vector(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 42})},
      {"u8", Array::from_vector(std::vector<uint8_t>{0, 200, 255})},
      {"mask", Array::from_vector(std::vector<bool>{true, false, true, true}, Shape{2, 2})},
      {"scalar", Array::scalar(7, int64, Device::cpu())},
      {"empty", Array::zeros({3, 0}, float32, Device::cpu())},
      {"updater/model:main/l1/W", sample({4, 3}, float32)},
      {"t3", Array::arange(0.0, 24.0, 1.0, float32, Device::cpu())
                 .reshape({2, 3, 4})
                 .transpose({2, 0, 1})},
  };
  write_npz(path, arrays, GetParam());
  python_ok(
      "f = np.load(r'" + path +
      "')\n"
      "def check(key, want, dtype):\n"
      "    got = f[key]\n"
      "    want = np.asarray(want, dtype=dtype)\n"
      "    assert got.dtype == want.dtype, (key, got.dtype, want.dtype)\n"
      "    assert got.shape == want.shape, (key, got.shape, want.shape)\n"
      "    assert np.array_equal(got, want), (key, got, want)\n"
      "check('f32', [[0.5, -1.5, 2.0], [3.25, 4, 5]], np.float32)\n"
      "check('f64', [1e300, -1e-300], np.float64)\n"
      "check('f16', [0.5, -2.0], np.float16)\n"
      "check('bf16', [1.5, -0.25], np.float32)\n"
      "check('i32', [-2**31, 2**31 - 1], np.int32)\n"
      "check('i64', [-2**63, 42], np.int64)\n"
      "check('u8', [0, 200, 255], np.uint8)\n"
      "check('mask', [[True, False], [True, True]], np.bool_)\n"
      "check('scalar', 7, np.int64)\n"
      "check('empty', np.zeros((3, 0)), np.float32)\n"
      "check('updater/model:main/l1/W', (np.arange(12).reshape(4, 3) - 3) * 0.5, np.float32)\n"
      "check('t3', np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1), np.float32)\n"
      "assert sorted(f.files) == sorted(" +
      [&] {
        std::string list = "[";
        for (const auto& [k, a] : arrays) list += "'" + k + "', ";
        return list + "]";
      }() +
      "), f.files\n"
      "import zipfile\n"
      "z = zipfile.ZipFile(r'" +
      path +
      "')\n"
      "assert z.testzip() is None\n" +
      std::string("assert all(i.compress_type == ") +
      (GetParam() ? "zipfile.ZIP_DEFLATED" : "zipfile.ZIP_STORED") + " for i in z.infolist())\n");
}

INSTANTIATE_TEST_SUITE_P(Compression, NumpyInteropTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "compressed" : "stored";
                         });

// --- ZIP64
// ----------------------------------------------------------------------------------------------

TEST_F(NpzTest, ForcedZip64RecordsAreReadByUsAndNumpy) {
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "compressed" : "stored");
    const std::string path = file(compress ? "z64c.npz" : "z64s.npz");
    NamedArrays arrays{
        {"a", sample({3, 5}, float32)}, {"b/c", sample_any({4}, int64)}, {"s", Array::scalar(1.5)}};
    detail::write_npz_impl(path, arrays, compress, "write_npz", /*force_zip64=*/true);
    NamedArrays back = read_npz(path);
    ASSERT_EQ(keys_of(back), keys_of(arrays));
    for (size_t i = 0; i < arrays.size(); ++i)
      EXPECT_EQ(bytes_of(back[i].second), bytes_of(arrays[i].second));
    python_ok(
        "import zipfile\n"
        "z = zipfile.ZipFile(r'" +
        path +
        "')\n"
        "assert z.testzip() is None\n"
        "f = np.load(r'" +
        path +
        "')\n"
        "assert np.array_equal(f['a'], ((np.arange(15) - 3) * 0.5).reshape(3, "
        "5).astype(np.float32))\n"
        "assert np.array_equal(f['b/c'], np.arange(4) * 1000003 - 5000)\n"
        "assert f['s'] == 1.5\n");
  }
}

TEST_F(NpzTest, MoreThan65535Members) {
  const std::string path = file("many.npz");
  constexpr int kCount = 65536 + 10;
  NamedArrays arrays;
  arrays.reserve(kCount);
  for (int i = 0; i < kCount; ++i)
    arrays.emplace_back("k" + std::to_string(i), Array::scalar(i, int32, Device::cpu()));
  write_npz(path, arrays, /*compress=*/false);
  NpzFile f(path);
  ASSERT_EQ(f.keys().size(), static_cast<size_t>(kCount));
  EXPECT_EQ(f.get("k0").item<int64_t>(), 0);
  EXPECT_EQ(f.get("k65535").item<int64_t>(), 65535);
  EXPECT_EQ(f.get("k" + std::to_string(kCount - 1)).item<int64_t>(), kCount - 1);
  python_ok("f = np.load(r'" + path +
            "')\n"
            "assert len(f.files) == " +
            std::to_string(kCount) +
            ", len(f.files)\n"
            "assert f['k65545'] == 65545\n");
}

// A real > 4 GiB archive: slow and needs ~10 GiB of memory and 5 GiB of disk, so it runs only on
// request (--gtest_also_run_disabled_tests). Forced ZIP64 above covers the same records cheaply.
TEST_F(NpzTest, DISABLED_HugeMemberNeedsZip64) {
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "compressed" : "stored");
    const std::string path = file("huge.npz");
    const int64_t n = (int64_t{1} << 32) + 4096;
    Array big = Array::zeros({n}, uint8, Device::cpu());
    static_cast<uint8_t*>(big.raw_data())[n - 1] = 9;
    NamedArrays arrays{{"big", big}, {"after", Array::from({1.0, 2.0})}};
    write_npz(path, arrays, compress);
    big = Array();
    arrays.clear();
    {
      NpzFile f(path);
      EXPECT_EQ(f.get("after").to_vector<double>(), (std::vector<double>{1.0, 2.0}));
      Array back = f.get("big");
      EXPECT_EQ(back.size(), n);
      EXPECT_EQ(static_cast<const uint8_t*>(back.raw_data())[n - 1], 9);
    }
    python_ok(
        "import zipfile\n"
        "z = zipfile.ZipFile(r'" +
        path +
        "')\n"
        "assert z.getinfo('big.npy').file_size > 2**32\n"
        "f = np.load(r'" +
        path +
        "')\n"
        "assert list(f['after']) == [1.0, 2.0]\n");
  }
}

// --- corrupt and unsupported files
// ---------------------------------------------------------------------

TEST_F(NpzTest, MissingFileNamesThePath) {
  expect_io_error([&] { read_npz(file("nope.npz")); }, {"read_npz", "nope.npz", "No such file"});
  Chain model;
  expect_io_error([&] { load_npz(file("nope.npz"), model); }, {"load_npz", "nope.npz"});
  expect_io_error([&] { read_npz(dir_.string()); }, {"directory"});
}

TEST_F(NpzTest, NotAZipFile) {
  write_bytes(file("text.npz"), "hello, this is not a zip archive at all");
  expect_io_error([&] { read_npz(file("text.npz")); },
                  {"text.npz", "not a valid npz", "end-of-central-directory"});
  write_bytes(file("tiny.npz"), "PK");
  expect_io_error([&] { read_npz(file("tiny.npz")); }, {"tiny.npz", "only 2 bytes"});
  write_bytes(file("zero.npz"), "");
  expect_io_error([&] { read_npz(file("zero.npz")); }, {"zero.npz"});
}

TEST_F(NpzTest, EveryTruncationIsDetected) {
  for (bool compress : {false, true}) {
    const std::string path = file("whole.npz");
    write_npz(path, {{"a", sample({3, 4}, float32)}, {"b", sample_any({5}, int64)}}, compress);
    const std::string whole = read_bytes(path);
    for (size_t len = 0; len < whole.size(); ++len) {
      write_bytes(file("cut.npz"), whole.substr(0, len));
      EXPECT_THROW(read_npz(file("cut.npz")), IOError)
          << "a file cut to " << len << " of " << whole.size() << " bytes was accepted";
    }
  }
}

// A member whose NPY header promises far more than the member holds (the IDX case of
// docs/reliability.md, in an npz): refused before anything that size is allocated, naming the
// file and the member, stored or deflated.
TEST_F(NpzTest, LyingMemberHeaderIsCaughtBeforeAllocating) {
  python_ok(
      "import zipfile, io\n"
      "from numpy.lib import format as npf\n"
      "def lying():\n"
      "    b = io.BytesIO()\n"
      "    npf.write_array_header_1_0(b, {'descr': '<f8', 'fortran_order': False,\n"
      "                                   'shape': (16777215, 28, 28)})\n"
      "    b.write(bytes(2352))\n"
      "    return b.getvalue()\n"
      "for name, method in (('stored', zipfile.ZIP_STORED), ('deflated', zipfile.ZIP_DEFLATED)):\n"
      "    with zipfile.ZipFile(r'" +
      dir_.string() +
      "/' + name + '.npz', 'w', method) as z:\n"
      "        z.writestr('a.npy', lying())\n");
  for (const char* name : {"stored.npz", "deflated.npz"}) {
    SCOPED_TRACE(name);
    expect_io_error([&] { read_npz(file(name)); },
                    {name, "'a.npy'", "the header describes shape (16777215, 28, 28)",
                     "only 2352 bytes of data follow it"});
  }
}

TEST_F(NpzTest, DamagedDataFailsTheCrc) {
  const std::string path = file("good.npz");
  Array a = sample({16, 16}, float32);
  write_npz(path, {{"a", a}}, /*compress=*/false);
  std::string bytes = read_bytes(path);
  // The data of the only member starts after its local header (30 + 5 bytes) and NPY header.
  const size_t data = 30 + 5 + 128 + 100;
  bytes[data] = static_cast<char>(bytes[data] ^ 0x10);
  write_bytes(file("bad.npz"), bytes);
  expect_io_error([&] { read_npz(file("bad.npz")); },
                  {"read_npz", "bad.npz", "a.npy", "CRC-32 mismatch"});
  // A damaged NPY header is reported as the CRC mismatch it causes.
  bytes = read_bytes(path);
  bytes[30 + 5 + 12] = 'X';
  write_bytes(file("bad2.npz"), bytes);
  expect_io_error([&] { read_npz(file("bad2.npz")); }, {"CRC-32 mismatch"});

  write_npz(path, {{"a", a}}, /*compress=*/true);
  bytes = read_bytes(path);
  for (size_t pos = 40; pos < 60; ++pos) {
    std::string damaged = bytes;
    damaged[pos] = static_cast<char>(damaged[pos] ^ 0x5a);
    write_bytes(file("bad3.npz"), damaged);
    EXPECT_THROW(read_npz(file("bad3.npz")), IOError)
        << "damage at byte " << pos << " went unnoticed";
  }
}

TEST_F(NpzTest, UnsupportedAndMalformedMembers) {
  python_ok(
      "import zipfile, io\n"
      "def npy(a):\n"
      "    b = io.BytesIO(); np.save(b, a); return b.getvalue()\n"
      "with zipfile.ZipFile(r'" +
      file("bz2.npz") +
      "', 'w', zipfile.ZIP_BZIP2) as z:\n"
      "    z.writestr('a.npy', npy(np.arange(3)))\n"
      "with zipfile.ZipFile(r'" +
      file("short.npz") +
      "', 'w') as z:\n"
      "    z.writestr('a.npy', npy(np.arange(10.0))[:-8])\n"
      "with zipfile.ZipFile(r'" +
      file("magic.npz") +
      "', 'w') as z:\n"
      "    z.writestr('a.npy', b'this is not an npy array, no magic here')\n"
      "with zipfile.ZipFile(r'" +
      file("header.npz") +
      "', 'w') as z:\n"
      "    z.writestr('a.npy', b'\\x93NUMPY\\x01\\x00\\x10\\x00{\"descr\": <f4 }  \\n')\n"
      "with zipfile.ZipFile(r'" +
      file("version.npz") +
      "', 'w') as z:\n"
      "    z.writestr('a.npy', b'\\x93NUMPY\\x07\\x00' + b' ' * 40)\n"
      "np.savez(r'" +
      file("complex.npz") +
      "', a=np.ones(2, dtype=np.complex64))\n"
      "np.savez(r'" +
      file("object.npz") +
      "', a=np.array([None, 1], dtype=object))\n"
      "np.savez(r'" +
      file("u8.npz") +
      "', a=np.ones(2, dtype=np.uint64))\n"
      "np.savez(r'" +
      file("struct.npz") +
      "', a=np.zeros(2, dtype=[('x', '<f4'), ('y', '<i4')]))\n"
      "np.savez(r'" +
      file("strings.npz") +
      "', a=np.array(['ab', 'c']))\n"
      "np.savez(r'" +
      file("highdim.npz") +
      "', a=np.zeros((1,) * 9))\n"
      "np.savez(r'" +
      file("mixed.npz") + "', good=np.arange(3), bad=np.ones(2, dtype=np.complex128))\n");
  expect_io_error([&] { read_npz(file("bz2.npz")); },
                  {"bz2.npz", "a.npy", "compression method 12", "bzip2"});
  expect_io_error([&] { read_npz(file("short.npz")); }, {"short.npz", "a.npy", "truncated"});
  expect_io_error([&] { read_npz(file("magic.npz")); }, {"magic.npz", "a.npy", "bad magic"});
  expect_io_error([&] { read_npz(file("header.npz")); }, {"header.npz", "malformed NPY header"});
  expect_io_error([&] { read_npz(file("version.npz")); }, {"unsupported NPY format version 7.0"});
  expect_io_error([&] { read_npz(file("complex.npz")); }, {"complex.npz", "'<c8'", "complex"});
  expect_io_error([&] { read_npz(file("object.npz")); }, {"'|O'", "pickled"});
  expect_io_error([&] { read_npz(file("u8.npz")); }, {"'<u8'", "uint64"});
  expect_io_error([&] { read_npz(file("struct.npz")); }, {"structured"});
  expect_io_error([&] { read_npz(file("strings.npz")); }, {"0-d"});
  expect_io_error([&] { read_npz(file("highdim.npz")); }, {"9 dimensions"});
  // Members are decoded on demand: the readable ones of a file stay readable.
  NpzFile mixed(file("mixed.npz"));
  EXPECT_EQ(mixed.get("good").to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  expect_io_error([&] { mixed.get("bad"); }, {"mixed.npz", "bad.npy", "complex"});
  expect_io_error([&] { mixed.get("ugly"); }, {"mixed.npz", "no array named 'ugly'"});
}

// --- atomic replacement
// ------------------------------------------------------------------------------

TEST_F(NpzTest, FailedWriteKeepsThePreviousFile) {
  const std::string path = file("model.npz");
  write_npz(path, {{"a", sample({4}, float32)}});
  const std::string before = read_bytes(path);
  ASSERT_EQ(listing(), std::vector<std::string>{"model.npz"});

  // Make the write fail halfway, as a full disk would: a file-size limit (with SIGXFSZ ignored,
  // write(2) then fails with EFBIG).
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string message;
  try {
    write_npz(path, {{"big", Array::zeros({1 << 20}, float32, Device::cpu())}}, /*compress=*/false);
  } catch (const IOError& e) {
    threw = true;
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw) << "the write should have failed";
  EXPECT_NE(message.find("model.npz"), std::string::npos) << message;
  EXPECT_NE(message.find("unchanged"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.npz"});

  // A write rejected for its arguments leaves no trace either.
  EXPECT_THROW(write_npz(path, {{"x", sample({2}, float32)}, {"x", sample({2}, float32)}}),
               ValueError);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.npz"});

  // A directory that does not exist: nothing is created.
  expect_io_error(
      [&] {
        write_npz(file("no/such/dir.npz"), {{"a", sample({2}, float32)}});
      },
      {"write_npz", "no/such"});

  // A successful write replaces the file and keeps its permissions.
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  write_npz(path, {{"b", sample({3}, float32)}});
  EXPECT_EQ(keys_of(read_npz(path)), std::vector<std::string>{"b"});
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.npz"});
}

// --- temporary files of killed writes (Note [Stale temporary files])
// ---------------------------------

using FileClock = fs::file_time_type::clock;

// A file last modified `age` ago (negative: in the future).
void make_aged_file(const fs::path& path, std::chrono::seconds age) {
  std::ofstream(path) << "half an archive";
  fs::last_write_time(path, FileClock::now() - age);
}

TEST(TemporaryFileNameTest, OnlyTheExactFormIsATemporaryFile) {
  EXPECT_EQ(detail::temporary_file_target(".model.npz.tmp.Ab12Cd"), "model.npz");
  EXPECT_EQ(detail::temporary_file_target(".snapshot_iter_5.1.tmp.000000"), "snapshot_iter_5.1");
  EXPECT_EQ(detail::temporary_file_target(".a.tmp.zzzzzz"), "a");
  for (const char* other : {"model.npz.tmp.Ab12Cd", ".model.npz.tmp.Ab12C", ".model.npz.tmp.Ab12Cde",
                            ".model.npz.tmp.Ab_2Cd", ".model.npz.tmp.", ".tmp.Ab12Cd", "..tmp.Ab12Cd",
                            ".model.npz.tmpAb12Cd", ".model.npz", ""}) {
    EXPECT_EQ(detail::temporary_file_target(other), std::nullopt) << other;
  }
}

// A successful write removes the temporary files that killed writes of the same file left, and
// nothing else: not other files' temporaries, not look-alikes, not a file a running write holds
// (locked), not one modified after the write began.
TEST_F(NpzTest, SuccessfulWriteRemovesStaleTemporaryFilesOfItsTarget) {
  const std::vector<std::string> stale = {".model.npz.tmp.Ab12Cd", ".model.npz.tmp.000000"};
  const std::vector<std::string> kept = {
      ".other.npz.tmp.Ab12Cd",    // another file's
      ".model.npz.tmp.Ab12C",     // not mkstemp's six characters
      "model.npz.tmp.Ab12Cd",     // no leading dot
      ".model.npz.1.tmp.Ab12Cd",  // another name
      ".model.npz.tmp.NewBbb",    // modified after the write began (below)
      ".model.npz.tmp.LiveAa",    // locked by a running write (below)
  };
  for (const std::string& name : stale) make_aged_file(dir_ / name, std::chrono::hours(2));
  for (const std::string& name : kept) make_aged_file(dir_ / name, std::chrono::hours(2));
  fs::last_write_time(dir_ / ".model.npz.tmp.NewBbb", FileClock::now() + std::chrono::hours(1));
  const int running = ::open((dir_ / ".model.npz.tmp.LiveAa").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(running, 0);
  ASSERT_EQ(::flock(running, LOCK_EX | LOCK_NB), 0);

  write_npz(file("model.npz"), {{"a", sample({3}, float32)}});
  std::vector<std::string> expected = kept;
  expected.push_back("model.npz");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listing(), expected);

  // Its writer gone, the next write of model.npz removes it (write_npy and save_npz alike).
  ::close(running);
  write_npy(file("model.npz"), sample({2}, float32));
  EXPECT_FALSE(fs::exists(dir_ / ".model.npz.tmp.LiveAa"));
  EXPECT_TRUE(fs::exists(dir_ / ".model.npz.tmp.NewBbb"));
}

// While a write runs, its temporary file is locked and listed as this process's own, so that no
// cleaner -- in this process or another -- takes it; a failed write removes it.
TEST_F(NpzTest, RunningWriteKeepsItsTemporaryFile) {
  {
    detail::AtomicOutputFile out(file("model.npz"), "test");
    out.write("abc", 3);
    const fs::path temp = out.temp_path();
    ASSERT_TRUE(fs::exists(temp));
    EXPECT_EQ(detail::temporary_file_target(temp.filename().string()), "model.npz");
    // Another process (another open file description) cannot take the lock.
    const int other = ::open(temp.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(other, 0);
    EXPECT_NE(::flock(other, LOCK_EX | LOCK_NB), 0);
    EXPECT_EQ(errno, EWOULDBLOCK);
    ::close(other);
    // A cleaner that would take anything of any age leaves it alone.
    EXPECT_EQ(remove_stale_temporary_files(
                  dir_.string(), [](const std::string&) { return true; },
                  FileClock::now() + std::chrono::hours(1)),
              std::vector<std::string>{});
    EXPECT_TRUE(fs::exists(temp));
  }
  EXPECT_EQ(listing(), std::vector<std::string>{}) << "an abandoned write removes its file";
  // A cleaner of one's own names returns what it removed.
  make_aged_file(dir_ / ".mine_1.tmp.Ab12Cd", std::chrono::hours(1));
  make_aged_file(dir_ / ".theirs_1.tmp.Ab12Cd", std::chrono::hours(1));
  EXPECT_EQ(remove_stale_temporary_files(
                dir_.string(), [](const std::string& t) { return t.starts_with("mine_"); }),
            std::vector<std::string>{".mine_1.tmp.Ab12Cd"});
  EXPECT_EQ(listing(), std::vector<std::string>{".theirs_1.tmp.Ab12Cd"});
}

// --- the serializers on links and other Serializables
// ----------------------------------------------

struct MLP : Chain {
  std::shared_ptr<links::Linear> l1, l2;
  // Explicit input sizes, or lazily sized layers when in_size is 0.
  MLP(int64_t in_size, int64_t hidden, int64_t out) {
    if (in_size > 0) {
      l1 = add_link("l1", std::make_shared<links::Linear>(in_size, hidden));
      l2 = add_link("l2", std::make_shared<links::Linear>(hidden, out));
    } else {
      l1 = add_link("l1", std::make_shared<links::Linear>(hidden));
      l2 = add_link("l2", std::make_shared<links::Linear>(out));
    }
  }
};

// Fills every parameter with distinct values.
void randomize(Link& link, double offset) {
  int i = 0;
  for (auto& [path, p] : link.namedparams(false)) {
    Array data = p.data();
    data.assign(sample(data.shape(), data.dtype(), offset + 10.0 * i++));
  }
}

// A lazily sized weight takes its shape from the snapshot; when that shape does not fit the
// input, the first forward says so and names the snapshot entry (before: an error deep in the
// matrix product, with no word of the snapshot).
TEST_F(NpzTest, LazyWeightOfTheWrongShapeNamesTheSnapshotEntry) {
  MLP model(3, 4, 2);
  const std::string path = file("mlp3.npz");
  save_npz(path, model);
  MLP lazy(0, 4, 2);
  load_npz(path, lazy);
  Variable x(Array::zeros({2, 5}, float32));  // 5 features, the snapshot's l1/W wants 3
  EXPECT_TRUE(testing::ThrowsWith<ShapeError>(
      [&] { (*lazy.l1)(x); }, {"Linear: the input has 5 features per example", "W of shape (4, 3)",
                               "its shape came from the snapshot entry 'l1/W'", "expects 3"}));
  // Inputs of the snapshot's size work; a parameter sized by its initializer names no snapshot.
  EXPECT_EQ((*lazy.l1)(Variable(Array::zeros({2, 3}, float32))).shape(), (Shape{2, 4}));
  MLP fresh(0, 4, 2);
  (*fresh.l1)(Variable(Array::zeros({2, 3}, float32)));
  EXPECT_TRUE(
      testing::ThrowsWith<ShapeError>([&] { (*fresh.l1)(x); }, {"W of shape (4, 3) expects 3"}));
}

TEST_F(NpzTest, LinkRoundTripIntoLazyModel) {
  for (bool compress : {true, false}) {
    MLP model(3, 4, 2);
    randomize(model, 0.25);
    const std::string path = file("mlp.npz");
    save_npz(path, model, compress);
    // Chainer's key layout.
    std::vector<std::string> keys = keys_of(read_npz(path));
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(keys, (std::vector<std::string>{"l1/W", "l1/b", "l2/W", "l2/b"}));

    MLP fresh(0, 4, 2);
    ASSERT_FALSE(fresh.l1->W.is_initialized());
    load_npz(path, fresh);
    ASSERT_TRUE(fresh.l1->W.is_initialized());
    auto a = model.namedparams(), b = fresh.namedparams();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_EQ(b[i].second.data().dtype(), float32);
      EXPECT_TRUE(ArraysClose(b[i].second.data(), a[i].second.data(), 0, 0)) << a[i].first;
    }
    // The loaded model computes what the saved one does.
    Variable x(Array::from({1, 2, 3, -1, 0, 0.5}, Shape{2, 3}));
    EXPECT_TRUE(
        ArraysClose((*fresh.l2)((*fresh.l1)(x)).data(), (*model.l2)((*model.l1)(x)).data()));

    // Loading into initialised parameters copies in place: handles held elsewhere see the values.
    MLP other(3, 4, 2);
    Array w_handle = other.l1->W.data();
    load_npz(path, other);
    EXPECT_TRUE(ArraysClose(w_handle, model.l1->W.data(), 0, 0));
  }
  // NumPy sees the same keys and values.
  MLP model(3, 4, 2);
  randomize(model, 0.0);
  save_npz(file("mlp.npz"), model);
  python_ok(
      "f = np.load(r'" + file("mlp.npz") +
      "')\n"
      "assert sorted(f.files) == ['l1/W', 'l1/b', 'l2/W', 'l2/b'], f.files\n"
      "assert f['l1/W'].shape == (4, 3) and f['l1/W'].dtype == np.float32\n"
      "assert np.array_equal(f['l1/W'].ravel(), ((np.arange(12) - 3) * 0.5).astype(np.float32))\n"
      "assert np.array_equal(f['l1/b'], ((np.arange(4) - 3) * 0.5 + 10).astype(np.float32))\n");
}

TEST_F(NpzTest, ShapeMismatchNamesTheKey) {
  MLP model(3, 4, 2);
  save_npz(file("mlp.npz"), model);
  MLP wrong(5, 4, 2);
  try {
    load_npz(file("mlp.npz"), wrong);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("load_npz"), std::string::npos) << m;
    EXPECT_NE(m.find("'l1/W'"), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 5)"), std::string::npos) << m;
  }
}

TEST_F(NpzTest, DtypeIsConvertedWhenLoadingIntoADefinedArray) {
  write_npz(file("d.npz"),
            {{"x", Array::from({1.5, -2.0, 3.0}, std::nullopt, float64)}, {"n", Array::scalar(3)}});
  NamedArrays arrays = read_npz(file("d.npz"));
  NpzDeserializer d(arrays);
  Array f32 = Array::zeros({3}, float32, Device::cpu());
  d("x", f32);
  EXPECT_EQ(f32.dtype(), float32);
  EXPECT_EQ(f32.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 3.0f}));
  Array i32 = Array::zeros({3}, int32, Device::cpu());
  d("x", i32);
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3}));
  // Into an undefined array: the stored array, on the CPU; later changes to the source do not leak
  // in.
  Array fresh;
  d("x", fresh);
  EXPECT_EQ(fresh.dtype(), float64);
  arrays[0].second.fill(0.0);
  EXPECT_EQ(fresh.to_vector<double>(), (std::vector<double>{1.5, -2.0, 3.0}));
  int64_t n = 0;
  d("n", n);
  EXPECT_EQ(n, 3);
}

TEST_F(NpzTest, StrictAndNonStrictMissingKeys) {
  // A file with l1 only.
  MLP full(3, 4, 2);
  randomize(full, 1.0);
  DictionarySerializer saver;
  saver.save(*full.l1);
  NamedArrays l1_only;
  for (const auto& [k, a] : saver.target()) l1_only.emplace_back("l1/" + k, a);
  write_npz(file("partial.npz"), l1_only);

  MLP model(3, 4, 2);
  randomize(model, 50.0);
  const Array l2_before = model.l2->W.data().copy();
  expect_io_error([&] { load_npz(file("partial.npz"), model); },
                  {"load_npz", "partial.npz", "no entry 'l2/W'", "strict"});

  load_npz(file("partial.npz"), model, "", /*strict=*/false);
  EXPECT_TRUE(ArraysClose(model.l1->W.data(), full.l1->W.data(), 0, 0));
  EXPECT_TRUE(ArraysClose(model.l1->b.data(), full.l1->b.data(), 0, 0));
  EXPECT_TRUE(ArraysClose(model.l2->W.data(), l2_before, 0, 0));

  // A missing key of an undefined value leaves it undefined when not strict.
  MLP lazy(0, 4, 2);
  load_npz(file("partial.npz"), lazy, "", /*strict=*/false);
  EXPECT_TRUE(lazy.l1->W.is_initialized());
  EXPECT_FALSE(lazy.l2->W.is_initialized());

  // ignore_names (full keys) are never loaded.
  MLP ignoring(3, 4, 2);
  randomize(ignoring, 80.0);
  const Array w_before = ignoring.l1->W.data().copy();
  load_npz(file("partial.npz"), ignoring, "", /*strict=*/false, {"l1/W"});
  EXPECT_TRUE(ArraysClose(ignoring.l1->W.data(), w_before, 0, 0));
  EXPECT_TRUE(ArraysClose(ignoring.l1->b.data(), full.l1->b.data(), 0, 0));
}

// A stand-in for a trainer: Chainer's snapshot layout "updater/model:main/...".
struct FakeTrainer : Serializable {
  std::shared_ptr<Link> model;
  int64_t iteration = 0;
  void serialize(Serializer& s) override {
    auto updater = s.child("updater");
    model->serialize(*updater->child("model:main"));
    (*updater)("iteration", iteration);
  }
};

TEST_F(NpzTest, PathSelectsASubTree) {
  auto model = std::make_shared<MLP>(3, 4, 2);
  randomize(*model, 3.0);
  FakeTrainer trainer;
  trainer.model = model;
  trainer.iteration = 1234;
  const std::string path = file("snapshot_iter_1234");
  save_npz(path, trainer);
  std::vector<std::string> keys = keys_of(read_npz(path));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"updater/iteration", "updater/model:main/l1/W",
                                            "updater/model:main/l1/b", "updater/model:main/l2/W",
                                            "updater/model:main/l2/b"}));

  MLP fresh(0, 4, 2);
  load_npz(path, fresh, "updater/model:main/");
  EXPECT_TRUE(ArraysClose(fresh.l2->W.data(), model->l2->W.data(), 0, 0));
  // Without the trailing slash (or with a leading one) the path means the same.
  MLP fresh2(0, 4, 2);
  load_npz(path, fresh2, "/updater/model:main");
  EXPECT_TRUE(ArraysClose(fresh2.l1->b.data(), model->l1->b.data(), 0, 0));
  // Forgetting the path: the error says which one to pass.
  MLP fresh3(0, 4, 2);
  expect_io_error([&] { load_npz(path, fresh3); },
                  {"no entry 'l1/W'", "path = \"updater/model:main/\""});
  // The whole snapshot loads back into a trainer.
  FakeTrainer restored;
  restored.model = std::make_shared<MLP>(0, 4, 2);
  load_npz(path, restored);
  EXPECT_EQ(restored.iteration, 1234);
  // ignore_names are full keys, path included.
  MLP ignoring(3, 4, 2);
  const Array w = ignoring.l1->W.data().copy();
  load_npz(path, ignoring, "updater/model:main/", true, {"updater/model:main/l1/W"});
  EXPECT_TRUE(ArraysClose(ignoring.l1->W.data(), w, 0, 0));
  EXPECT_TRUE(ArraysClose(ignoring.l2->W.data(), model->l2->W.data(), 0, 0));
}

// An optimizer-like object: scalars, a string, a bool and per-parameter state arrays.
struct OptimizerState : Serializable {
  double lr = 0.0;
  int64_t t = 0;
  bool use_nesterov = false;
  std::string name;
  Array m;
  Array v;
  void serialize(Serializer& s) override {
    s("lr", lr);
    s("t", t);
    s("use_nesterov", use_nesterov);
    s("name", name);
    auto state = s.child("/l1/W/");
    (*state)("m", m);
    (*state)("/v", v);
  }
};

TEST_F(NpzTest, ScalarsStringsAndStates) {
  OptimizerState saved;
  saved.lr = 0.0125;
  saved.t = (int64_t{1} << 40) + 3;
  saved.use_nesterov = true;
  saved.name = "Adam \xe2\x9c\x93";
  saved.m = sample({2, 3}, float32);
  saved.v = sample({2, 3}, float64, 9.0);
  const std::string path = file("opt.npz");
  save_npz(path, saved);
  std::vector<std::string> keys = keys_of(read_npz(path));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys,
            (std::vector<std::string>{"l1/W/m", "l1/W/v", "lr", "name", "t", "use_nesterov"}));

  OptimizerState loaded;
  loaded.m = Array::zeros({2, 3}, float32, Device::cpu());
  load_npz(path, loaded);
  EXPECT_EQ(loaded.lr, 0.0125);
  EXPECT_EQ(loaded.t, saved.t);
  EXPECT_TRUE(loaded.use_nesterov);
  EXPECT_EQ(loaded.name, saved.name);
  EXPECT_TRUE(ArraysClose(loaded.m, saved.m, 0, 0));
  EXPECT_EQ(loaded.v.dtype(), float64);
  EXPECT_TRUE(ArraysClose(loaded.v, saved.v, 0, 0));

  python_ok("f = np.load(r'" + path +
            "')\n"
            "assert f['t'].shape == () and f['t'].dtype == np.int64 and f['t'] == 2**40 + 3\n"
            "assert f['lr'].dtype == np.float64 and f['lr'] == 0.0125\n"
            "assert f['use_nesterov'].dtype == np.bool_ and f['use_nesterov']\n"
            "assert bytes(f['name']).decode('utf-8') == 'Adam \\u2713'\n"
            "assert f['l1/W/m'].shape == (2, 3)\n");

  // A value Chainer saved (str as a 0-d unicode array, Python int and float) loads too.
  python_ok("np.savez(r'" + file("chainer.npz") +
            "', lr=np.asarray(0.5), t=np.asarray(12), "
            "use_nesterov=np.asarray(False), name=np.asarray('MomentumSGD'), **{'l1/W/m': "
            "np.ones((2, 3)), "
            "'l1/W/v': np.zeros((2, 3), dtype=np.float32)})");
  OptimizerState from_chainer;
  from_chainer.use_nesterov = true;
  load_npz(file("chainer.npz"), from_chainer);
  EXPECT_EQ(from_chainer.lr, 0.5);
  EXPECT_EQ(from_chainer.t, 12);
  EXPECT_FALSE(from_chainer.use_nesterov);
  EXPECT_EQ(from_chainer.name, "MomentumSGD");
  EXPECT_EQ(from_chainer.m.to_vector<double>(), std::vector<double>(6, 1.0));
}

// A minimal momentum optimizer, to check Optimizer::serialize end to end.
class TestMomentum : public Optimizer {
 public:
  TestMomentum() { declare_hyperparam("lr", 0.1); }
  const char* type_name() const override { return "TestMomentum"; }

 protected:
  void init_state(ParamState& state) override { state.add("v", Array()); }
  void update_one(ParamState& state) override {
    Array v = state.get("v");
    v.assign(v * 0.9 - state.param.grad() * hyperparam("lr"));
    Array w = state.param.data();
    w.assign(w + v);
  }
};

// An integer entry that is not an exact int64 (float64 1e30, 2.5) or a counter below zero is an
// IOError naming the key and the value (Note [Integers read from a snapshot]); before, 1e30 was
// converted with undefined behaviour into a garbage counter.
TEST_F(NpzTest, ImpossibleIntegersNameTheKey) {
  python_ok("np.savez(r'" + file("huge.npz") +
            "', t=np.float64(1e30))\n"
            "np.savez(r'" +
            file("half.npz") +
            "', t=np.float64(2.5))\n"
            "np.savez(r'" +
            file("exact.npz") +
            "', t=np.float64(12.0))\n"
            "np.savez(r'" +
            file("negative.npz") +
            "', t=np.int64(-5), epoch=np.int64(0))\n"
            "np.savez(r'" +
            file("negative_epoch.npz") + "', t=np.int64(3), epoch=np.int64(-1))");
  OptimizerState state;
  expect_io_error([&] { load_npz(file("huge.npz"), state, "", false); }, {"'t'", "1e+30", "int64"});
  expect_io_error([&] { load_npz(file("half.npz"), state, "", false); }, {"'t'", "2.5"});
  load_npz(file("exact.npz"), state, "", false);
  EXPECT_EQ(state.t, 12);
  // A counter (Serializer::count) must not be negative.
  TestMomentum opt;
  expect_io_error([&] { load_npz(file("negative.npz"), opt, "", false); },
                  {"'t'", "-5", "non-negative"});
  expect_io_error([&] { load_npz(file("negative_epoch.npz"), opt, "", false); },
                  {"'epoch'", "-1", "non-negative"});
}

TEST_F(NpzTest, OptimizerRoundTrip) {
  auto model = std::make_shared<MLP>(3, 4, 2);
  randomize(*model, 0.0);
  TestMomentum opt;
  opt.setup(model);
  for (int step = 0; step < 3; ++step) {
    for (auto& [path, p] : model->namedparams()) p.set_grad(Array::full_like(p.data(), 0.5 + step));
    opt.update();
  }
  opt.new_epoch();
  const std::string path = file("optimizer.npz");
  save_npz(path, opt);
  std::vector<std::string> keys = keys_of(read_npz(path));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"epoch", "l1/W/t", "l1/W/v", "l1/b/t", "l1/b/v",
                                            "l2/W/t", "l2/W/v", "l2/b/t", "l2/b/v", "t"}));

  auto model2 = std::make_shared<MLP>(3, 4, 2);
  TestMomentum opt2;
  opt2.setup(model2);
  load_npz(path, opt2);
  EXPECT_EQ(opt2.t(), 3);
  EXPECT_EQ(opt2.epoch(), 1);
  auto& s1 = opt.param_states();
  auto& s2 = opt2.param_states();
  ASSERT_EQ(s1.size(), s2.size());
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_EQ(s2[i].t, 3);
    EXPECT_TRUE(s2[i].initialized);
    EXPECT_TRUE(ArraysClose(s2[i].get("v"), s1[i].get("v"), 0, 0)) << s1[i].path;
  }
}

TEST_F(NpzTest, DictionarySerializerKeysAndInMemoryLoading) {
  MLP model(2, 3, 1);
  randomize(model, 0.0);
  DictionarySerializer s("prefix");
  EXPECT_EQ(s.path(), "prefix/");
  EXPECT_FALSE(s.is_loading());
  s.save(model);
  EXPECT_EQ(keys_of(s.target()),
            (std::vector<std::string>{"prefix/l1/W", "prefix/l1/b", "prefix/l2/W", "prefix/l2/b"}));
  // CPU arrays are stored as views (Note [DictionarySerializer stores views]).
  EXPECT_TRUE(s.target()[0].second.shares_memory_with(model.l1->W.data()));
  // A lazily sized parameter that was never initialised is not stored.
  MLP lazy(0, 3, 1);
  DictionarySerializer s2;
  s2.save(lazy);
  EXPECT_EQ(keys_of(s2.target()), (std::vector<std::string>{"l1/b", "l2/b"}));

  MLP fresh(0, 3, 1);
  NpzDeserializer d(s.target(), "prefix/");
  EXPECT_TRUE(d.is_loading());
  EXPECT_TRUE(d.contains("l1/W"));
  EXPECT_FALSE(d.contains("l9/W"));
  EXPECT_TRUE(d.child("l1")->contains("W"));
  EXPECT_EQ(d.child("l1")->path(), "prefix/l1/");
  d.load(fresh);
  EXPECT_TRUE(ArraysClose(fresh.l2->W.data(), model.l2->W.data(), 0, 0));
  // The loaded values are copies, not views of the source.
  EXPECT_FALSE(fresh.l1->W.data().shares_memory_with(model.l1->W.data()));
  NpzDeserializer ignoring(s.target(), "prefix/", true, {"prefix/l1/W"});
  EXPECT_FALSE(ignoring.contains("l1/W"));
}

TEST_F(NpzTest, NpzFileReadsLazily) {
  write_npz(file("lazy.npz"), {{"a", sample({2}, float32)}, {"b/c", sample({3}, float64)}});
  auto f = std::make_shared<const NpzFile>(file("lazy.npz"));
  EXPECT_EQ(f->keys(), (std::vector<std::string>{"a", "b/c"}));
  EXPECT_TRUE(f->contains("b/c"));
  EXPECT_FALSE(f->contains("b"));
  EXPECT_EQ(f->path(), file("lazy.npz"));
  Array c;
  NpzDeserializer d(f, "b");
  d("c", c);
  EXPECT_EQ(c.to_vector<double>(), sample({3}, float64).to_vector<double>());
}

TEST_F(NpzTest, GpuArraysRoundTrip) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is available on this machine";
  Array g = sample({3, 4}, float32).to_device(Device::cuda(0));
  DictionarySerializer s;
  s("g", g);
  EXPECT_EQ(s.target()[0].second.device(), Device::cpu());
  write_npz(file("gpu.npz"), s.target());
  Array target = Array::zeros({3, 4}, float16, Device::cuda(0));
  NpzDeserializer d(read_npz(file("gpu.npz")));
  d("g", target);
  EXPECT_EQ(target.device(), Device::cuda(0));
  EXPECT_TRUE(ArraysClose(target, sample({3, 4}, float16), 0, 0));
}

}  // namespace
}  // namespace kusari
