// kusari.datasets and kusari.iterators: the C++ datasets and iterators, and any Python sequence
// used as a dataset.
//
// Note [Python datasets]
// Wherever kusari takes a dataset (an iterator, scatter_dataset, split_dataset), a Python object
// with __len__ and __getitem__ works too (a list of (x, t) tuples, Chainer's own dataset classes):
// PyDataset calls it under the GIL and converts each example, a tuple of arrays and numbers or a
// single array, as array_from_python does (NumPy arrays without a copy). Examples go back to
// Python as tuples of NumPy arrays (views).
#include "common.h"
#include "kusari/datasets/convert.h"
#include "kusari/datasets/mnist.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/tuple_dataset.h"
#include "kusari/datasets/image.h"
#include "kusari/datasets/transforms.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/iterators/multithread_iterator.h"
#include "kusari/iterators/serial_iterator.h"

namespace kusari::python {
namespace {

Example example_from_python(py::handle item) {
  Example e;
  if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
    for (py::handle h : item) e.push_back(array_from_python(h, "dataset example"));
  } else {
    e.push_back(array_from_python(item, "dataset example"));
  }
  return e;
}

class PyDataset : public Dataset {
 public:
  explicit PyDataset(py::object seq) : seq_(hold(std::move(seq))) {
    py::gil_scoped_acquire gil;
    size_ = static_cast<int64_t>(py::len(seq_->object));
  }
  int64_t size() const override { return size_; }
  Example get_example(int64_t i) const override {
    py::gil_scoped_acquire gil;
    return example_from_python(seq_->object[py::int_(i)]);
  }
  std::vector<Example> get_examples(const std::vector<int64_t>& indices) const override {
    py::gil_scoped_acquire gil;
    std::vector<Example> out;
    out.reserve(indices.size());
    for (int64_t i : indices) out.push_back(example_from_python(seq_->object[py::int_(i)]));
    return out;
  }
  py::object object() const { return seq_->object; }

 private:
  std::shared_ptr<GilObject> seq_;
  int64_t size_ = 0;
};

py::tuple example_to_python(const Example& e) {
  py::tuple t(e.size());
  for (size_t i = 0; i < e.size(); ++i) t[i] = array_to_python(e[i]);
  return t;
}

py::list batch_to_python(const std::vector<Example>& batch) {
  py::list out;
  for (const Example& e : batch) out.append(example_to_python(e));
  return out;
}

std::optional<uint64_t> optional_seed(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return h.cast<uint64_t>();
}

}  // namespace

std::shared_ptr<Dataset> dataset_from_python(py::handle obj, const char* where) {
  if (obj.is_none()) return nullptr;
  if (py::isinstance<Dataset>(obj)) return obj.cast<std::shared_ptr<Dataset>>();
  if (!py::hasattr(obj, "__len__") || !py::hasattr(obj, "__getitem__")) {
    throw py::type_error(std::string(where) + ": expected a dataset (a kusari dataset, or a sequence with __len__ and "
                         "__getitem__ such as a list of (x, t) tuples), got " +
                         py::str(py::type::of(obj)).cast<std::string>());
  }
  return std::make_shared<PyDataset>(py::reinterpret_borrow<py::object>(obj));
}

py::object dataset_to_python(const std::shared_ptr<Dataset>& d) {
  if (!d) return py::none();
  if (auto* p = dynamic_cast<PyDataset*>(d.get())) return p->object();
  return py::cast(d);
}

void init_data(py::module_& m) {
  py::class_<Dataset, std::shared_ptr<Dataset>>(m, "Dataset", "A dataset: examples by index (Chainer's DatasetMixin).")
      .def("__len__", &Dataset::size)
      .def("__getitem__", [](const Dataset& d, py::handle index) -> py::object {
        const int64_t n = d.size();
        if (PySlice_Check(index.ptr())) {
          Py_ssize_t start = 0, stop = 0, step = 0, len = 0;
          if (PySlice_GetIndicesEx(index.ptr(), n, &start, &stop, &step, &len) != 0) throw py::error_already_set();
          std::vector<int64_t> idx;
          for (Py_ssize_t k = 0, i = start; k < len; ++k, i += step) idx.push_back(i);
          return batch_to_python(d.get_examples(idx));
        }
        int64_t i = index.cast<int64_t>();
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw py::index_error("dataset index " + std::to_string(index.cast<int64_t>()) +
                                                  " out of range for " + std::to_string(n) + " examples");
        return example_to_python(d.get_example(i));
      })
      .def("get_example", [](const Dataset& d, int64_t i) { return example_to_python(d.get_example(i)); }, py::arg("i"))
      .def("__iter__", [](py::object self) {
        return py::module_::import("builtins").attr("iter")(
            py::module_::import("builtins").attr("map")(self.attr("__getitem__"),
                                                        py::module_::import("builtins").attr("range")(py::len(self))));
      });

  py::class_<TupleDataset, Dataset, std::shared_ptr<TupleDataset>>(m, "TupleDataset")
      .def(py::init([](py::args columns) {
             std::vector<Array> cols;
             for (py::handle h : columns) cols.push_back(array_from_python(h, "TupleDataset"));
             return std::make_shared<TupleDataset>(std::move(cols));
           }),
           "TupleDataset(x, t, ...): the i-th example is (x[i], t[i], ...); the arrays are NumPy arrays (no copy) "
           "or anything array-like.")
      .def_property_readonly("columns", [](const TupleDataset& d) {
        py::list out;
        for (const Array& a : d.columns()) out.append(array_to_python(a));
        return out;
      });

  py::class_<SubDataset, Dataset, std::shared_ptr<SubDataset>>(m, "SubDataset")
      .def(py::init([](py::handle dataset, int64_t start, int64_t finish, py::handle order) {
             std::vector<int64_t> o;
             if (!order.is_none()) o = order.cast<std::vector<int64_t>>();
             return std::make_shared<SubDataset>(dataset_from_python(dataset, "SubDataset"), start, finish, o);
           }),
           py::arg("dataset"), py::arg("start"), py::arg("finish"), py::arg("order") = py::none());
  m.def("split_dataset", [](py::handle dataset, int64_t first_size, py::handle order) {
          std::vector<int64_t> o;
          if (!order.is_none()) o = order.cast<std::vector<int64_t>>();
          auto [a, b] = split_dataset(dataset_from_python(dataset, "split_dataset"), first_size, o);
          return py::make_tuple(a, b);
        }, py::arg("dataset"), py::arg("first_size"), py::arg("order") = py::none());
  m.def("split_dataset_random", [](py::handle dataset, int64_t first_size, py::handle seed) {
          auto [a, b] = split_dataset_random(dataset_from_python(dataset, "split_dataset_random"), first_size,
                                             optional_seed(seed));
          return py::make_tuple(a, b);
        }, py::arg("dataset"), py::arg("first_size"), py::arg("seed") = py::none());

  auto mnist = [](const char* name, bool fashion) {
    return [name, fashion](bool withlabel, int ndim, double scale, Dtype dtype, Dtype label_dtype, bool rgb_format,
                           py::handle directory) {
      if (rgb_format) throw py::value_error(std::string(name) + ": rgb_format=True is not supported");
      if (ndim != 1 && ndim != 2 && ndim != 3) {
        throw py::value_error(std::string(name) + ": ndim must be 1, 2 or 3, got " + std::to_string(ndim));
      }
      MnistOptions o;
      o.withlabel = withlabel;
      o.ndim = ndim;
      o.scale = scale;
      o.dtype = dtype;
      o.label_dtype = label_dtype;
      if (!directory.is_none()) o.directory = py::str(directory).cast<std::string>();
      TupleDatasetPair p;
      {
        py::gil_scoped_release r;
        p = fashion ? get_fashion_mnist(o) : get_mnist(o);
      }
      return py::make_tuple(p.first, p.second);
    };
  };
  m.def("get_mnist", mnist("get_mnist", false), py::arg("withlabel") = true, py::arg("ndim") = 1,
        py::arg("scale") = 1.0, py::arg("dtype") = Dtype::kFloat32, py::arg("label_dtype") = Dtype::kInt32,
        py::arg("rgb_format") = false, py::arg("directory") = py::none(),
        "(train, test) MNIST from the local IDX files: `directory`, else $KUSARI_DATASET_ROOT/mnist. Nothing is "
        "downloaded; without the files, the error says where to put them.");
  m.def("get_fashion_mnist", mnist("get_fashion_mnist", true), py::arg("withlabel") = true, py::arg("ndim") = 1,
        py::arg("scale") = 1.0, py::arg("dtype") = Dtype::kFloat32, py::arg("label_dtype") = Dtype::kInt32,
        py::arg("rgb_format") = false, py::arg("directory") = py::none(),
        "(train, test) Fashion-MNIST from `directory`, $KUSARI_DATASET_ROOT/fashion-mnist or Debian's "
        "dataset-fashion-mnist.");
  m.def("concat_examples", [](py::handle batch, py::handle device, py::handle padding) {
          std::vector<Example> examples;
          for (py::handle item : batch) examples.push_back(example_from_python(item));
          std::optional<Scalar> pad;
          if (!padding.is_none()) pad = padding.cast<Scalar>();
          const Device dev = device_from_python(device, "concat_examples");
          std::vector<Array> arrays;
          {
            py::gil_scoped_release r;
            arrays = concat_examples(examples, dev, pad);
          }
          py::tuple t(arrays.size());
          for (size_t i = 0; i < arrays.size(); ++i) t[i] = array_to_python(arrays[i]);
          if (arrays.size() == 1) return py::object(t[0]);
          return py::object(t);
        }, py::arg("batch"), py::arg("device") = py::none(), py::arg("padding") = py::none(),
        "Stacks a list of examples into batch arrays (a tuple, or one array for examples of one array).");

  // --- iterators
  py::class_<Iterator, std::shared_ptr<Iterator>>(m, "Iterator")
      .def("next", [](Iterator& it) {
        std::vector<Example> batch;
        {
          py::gil_scoped_release r;
          batch = it.next();
        }
        if (batch.empty()) throw py::stop_iteration();
        return batch_to_python(batch);
      })
      .def("__next__", [](Iterator& it) {
        std::vector<Example> batch;
        {
          py::gil_scoped_release r;
          batch = it.next();
        }
        if (batch.empty()) throw py::stop_iteration();
        return batch_to_python(batch);
      })
      .def("__iter__", [](py::object self) { return self; })
      .def_property_readonly("epoch", &Iterator::epoch)
      .def_property_readonly("epoch_detail", &Iterator::epoch_detail)
      .def_property_readonly("previous_epoch_detail", &Iterator::previous_epoch_detail)
      .def_property_readonly("is_new_epoch", &Iterator::is_new_epoch)
      .def_property_readonly("batch_size", &Iterator::batch_size)
      .def_property_readonly("repeat", &Iterator::repeat)
      .def("reset", &Iterator::reset)
      .def("finalize", &Iterator::finalize);
  py::class_<SerialIterator, Iterator, std::shared_ptr<SerialIterator>>(m, "SerialIterator")
      .def(py::init([](py::handle dataset, int64_t batch_size, bool repeat, bool shuffle, py::handle seed) {
             return std::make_shared<SerialIterator>(dataset_from_python(dataset, "SerialIterator"), batch_size, repeat,
                                                     shuffle, optional_seed(seed));
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("repeat") = true, py::arg("shuffle") = true,
           py::arg("seed") = py::none())
      .def_property_readonly("dataset", [](const SerialIterator& it) { return dataset_to_python(it.dataset()); })
      .def_property_readonly("current_position", &SerialIterator::current_position);
  py::class_<MultithreadIterator, Iterator, std::shared_ptr<MultithreadIterator>>(m, "MultithreadIterator")
      .def(py::init([](py::handle dataset, int64_t batch_size, bool repeat, bool shuffle, py::handle n_threads,
                       py::handle seed) {
             const int n = n_threads.is_none() ? 0 : n_threads.cast<int>();
             return std::make_shared<MultithreadIterator>(dataset_from_python(dataset, "MultithreadIterator"),
                                                          batch_size, repeat, shuffle, optional_seed(seed), n);
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("repeat") = true, py::arg("shuffle") = true,
           py::arg("n_threads") = py::none(), py::arg("seed") = py::none())
      .def_property_readonly("dataset", [](const MultithreadIterator& it) { return dataset_to_python(it.dataset()); })
      .def_property_readonly("current_position", &MultithreadIterator::current_position);

  // --- images: datasets of image files, transforms, the parallel loader, and image files
  namespace TR = kusari::transforms;
  auto decode = [](int channels) {
    DecodeOptions o;
    o.channels = channels;
    return o;
  };
  py::class_<ImageFileDataset, Dataset, std::shared_ptr<ImageFileDataset>>(m, "ImageFileDataset");
  py::class_<LabeledImageDataset, ImageFileDataset, std::shared_ptr<LabeledImageDataset>>(m, "LabeledImageDataset")
      .def(py::init([decode](py::handle pairs, const std::string& root, int channels) {
             if (py::isinstance<py::str>(pairs)) {
               return std::make_shared<LabeledImageDataset>(pairs.cast<std::string>(), root, decode(channels));
             }
             return std::make_shared<LabeledImageDataset>(pairs.cast<std::vector<std::pair<std::string, int32_t>>>(),
                                                          root, decode(channels));
           }),
           py::arg("pairs"), py::arg("root") = ".", py::arg("channels") = 3,
           "Images and labels from a list file of 'path label' lines, or a list of (path, label) pairs (Chainer's "
           "LabeledImageDataset); example i is (uint8 (H, W, C) image, int32 label), decoded when read.");
  py::class_<ImageFolderDataset, ImageFileDataset, std::shared_ptr<ImageFolderDataset>>(m, "ImageFolderDataset")
      .def(py::init([decode](const std::string& root, int channels) {
             return std::make_shared<ImageFolderDataset>(root, decode(channels));
           }),
           py::arg("root"), py::arg("channels") = 3, "One subfolder per class (torchvision's ImageFolder).")
      .def_property_readonly("classes", &ImageFolderDataset::classes);

  py::module_ tr = m.def_submodule("transforms", "Image transforms run by ImageLoader's workers");
  py::class_<TR::Transform, std::shared_ptr<TR::Transform>>(tr, "Transform")
      .def_property_readonly("name", &TR::Transform::name);
  py::class_<TR::RandomResizedCrop, TR::Transform, std::shared_ptr<TR::RandomResizedCrop>>(tr, "RandomResizedCrop")
      .def(py::init([](int64_t size, std::array<double, 2> scale, std::array<double, 2> ratio) {
             return std::make_shared<TR::RandomResizedCrop>(size, scale, ratio);
           }),
           py::arg("size"), py::arg("scale") = std::array<double, 2>{0.08, 1.0},
           py::arg("ratio") = std::array<double, 2>{3.0 / 4.0, 4.0 / 3.0});
  py::class_<TR::Resize, TR::Transform, std::shared_ptr<TR::Resize>>(tr, "Resize").def(py::init<int64_t>(), py::arg("size"));
  py::class_<TR::CenterCrop, TR::Transform, std::shared_ptr<TR::CenterCrop>>(tr, "CenterCrop")
      .def(py::init<int64_t>(), py::arg("size"));
  py::class_<TR::RandomHorizontalFlip, TR::Transform, std::shared_ptr<TR::RandomHorizontalFlip>>(tr,
                                                                                                 "RandomHorizontalFlip")
      .def(py::init<double>(), py::arg("p") = 0.5);
  py::class_<TR::Normalize, TR::Transform, std::shared_ptr<TR::Normalize>>(tr, "Normalize")
      .def(py::init<std::vector<float>, std::vector<float>, bool>(), py::arg("mean"), py::arg("std"),
           py::arg("planar") = true);
  py::class_<TR::ToCHW, TR::Transform, std::shared_ptr<TR::ToCHW>>(tr, "ToCHW").def(py::init<>());
  py::class_<TR::Compose, TR::Transform, std::shared_ptr<TR::Compose>>(tr, "Compose")
      .def(py::init([](const std::vector<std::shared_ptr<TR::Transform>>& steps) {
             std::vector<std::shared_ptr<const TR::Transform>> s(steps.begin(), steps.end());
             return std::make_shared<TR::Compose>(std::move(s));
           }),
           py::arg("steps"));

  tr.attr("IMAGENET_MEAN") = TR::kImageNetMean;
  tr.attr("IMAGENET_STD") = TR::kImageNetStd;
  tr.def("imagenet_train_transform", [](int64_t size, double min_scale, bool planar) {
           return std::make_shared<TR::Compose>(std::vector<std::shared_ptr<const TR::Transform>>{
               std::make_shared<TR::RandomResizedCrop>(size, std::array<double, 2>{min_scale, 1.0}),
               std::make_shared<TR::RandomHorizontalFlip>(),
               std::make_shared<TR::Normalize>(TR::kImageNetMean, TR::kImageNetStd, planar)});
         }, py::arg("size") = 224, py::arg("min_scale") = 0.08, py::arg("planar") = true,
         "A random crop of min_scale to all of the picture resized to size x size, a flip, ImageNet's normalisation.");
  tr.def("imagenet_eval_transform", &TR::imagenet_eval_transform, py::arg("size") = 224, py::arg("resize") = 256,
         py::arg("planar") = true, "The shorter side resized to `resize`, the centre size x size crop, normalised.");

  py::class_<ImageLoader, Iterator, std::shared_ptr<ImageLoader>>(m, "ImageLoader")
      .def(py::init([](py::handle dataset, int64_t batch_size, bool repeat, bool shuffle, py::handle seed,
                       int n_workers, int n_prefetch, std::shared_ptr<TR::Compose> transform, py::handle device,
                       bool normalize_on_device, Dtype dtype) {
             ImageLoaderOptions o;
             o.batch_size = batch_size;
             o.repeat = repeat;
             o.shuffle = shuffle;
             o.seed = optional_seed(seed);
             o.n_workers = n_workers;
             o.n_prefetch = n_prefetch;
             o.transform = transform;
             o.device = device_from_python(device, "ImageLoader");
             o.normalize_on_device = normalize_on_device;
             o.dtype = dtype;
             return std::make_shared<ImageLoader>(dataset_from_python(dataset, "ImageLoader"), o);
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("repeat") = true, py::arg("shuffle") = true,
           py::arg("seed") = py::none(), py::arg("n_workers") = 0, py::arg("n_prefetch") = 2,
           py::arg("transform") = nullptr, py::arg("device") = py::none(), py::arg("normalize_on_device") = false,
           py::arg("dtype") = Dtype::kFloat32,
           "Decodes and transforms image batches on C++ worker threads (0: the host's cores), prefetched; the "
           "batches are stacked arrays, on `device`.");

  m.def("read_image", [decode](const std::string& path, int channels) {
          return array_to_python(image_to_array(decode_image(path, decode(channels))));
        }, py::arg("path"), py::arg("channels") = 3, "A uint8 (H, W, C) array of a JPEG or PNG file.");
  m.def("write_image", [](const std::string& path, py::handle image, int quality) {
          Array a = array_from_python(image, "write_image", Dtype::kUInt8);
          Image img = image_from_array(a.to_device(Device::cpu()).contiguous());
          const std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
          if (ext == ".png" || ext == ".PNG") {
            write_png(path, img);
          } else {
            write_jpeg(path, img, quality);
          }
        }, py::arg("path"), py::arg("image"), py::arg("quality") = 90,
        "Writes a uint8 (H, W, C) or (H, W) array as PNG (a .png path) or JPEG, atomically.");
}

}  // namespace kusari::python
