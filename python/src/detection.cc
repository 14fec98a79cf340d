// Object detection from Python: kusari.models.RetinaNet and FasterRCNN (with their options,
// anchors, matching and mAP evaluation) and kusari.datasets' COCO-style detection datasets, synthetic pictures and
// box-aware augmentation (kusari/models/retinanet.h, faster_rcnn.h, detection_metrics.h,
// kusari/datasets/detection.h).
//
// Note [Detection values in Python]
// Boxes, labels and scores cross as NumPy arrays, as ChainerCV's detectors take and give them: a
// picture's boxes are float32 (R, 4) (y_min, x_min, y_max, x_max), its labels int32 (R,). Where
// the C++ takes one array per image (the detectors' loss, eval_detection), Python gives a sequence
// of arrays, and predict() returns ChainerCV's triple (bboxes, labels, scores) of lists. The
// augmentation functions take and return (image, bbox, label) tuples; their randomness comes from
// a kusari Generator seeded with `seed`, or, without one, from the process's default generator
// (kusari.manual_seed), one number of which seeds the call's own generator while the GIL is held.
#include "common.h"
#include "kusari/datasets/detection.h"
#include "kusari/models/detection_metrics.h"
#include "kusari/models/faster_rcnn.h"
#include "kusari/models/retinanet.h"

namespace kusari::python {
namespace {

namespace M = kusari::models;

// One array per element of a Python sequence (None gives none).
std::vector<Array> arrays_from_python(py::handle seq, const char* where) {
  std::vector<Array> out;
  if (seq.is_none()) return out;
  for (py::handle h : seq) out.push_back(array_from_python(h, where));
  return out;
}

py::list arrays_to_python(const std::vector<Array>& arrays) {
  py::list out;
  for (const Array& a : arrays) out.append(array_to_python(a));
  return out;
}

DetectionExample example_from_python(py::handle image, py::handle bbox, py::handle label,
                                     const char* where) {
  return {array_from_python(image, where), array_from_python(bbox, where),
          array_from_python(label, where)};
}

py::tuple example_to_python(const DetectionExample& e) {
  return py::make_tuple(array_to_python(e.image), array_to_python(e.bbox), array_to_python(e.label));
}

// The generator of a call: Generator(seed), or one seeded from the default generator.
Generator generator_of(py::handle seed) {
  if (seed.is_none()) return Generator(default_generator().next_uint64());
  return Generator(seed.cast<uint64_t>());
}

M::ResNetBlock block_from_python(py::handle h) {
  if (py::isinstance<py::str>(h)) {
    const std::string s = h.cast<std::string>();
    if (s == "basic") return M::ResNetBlock::kBasic;
    if (s == "bottleneck") return M::ResNetBlock::kBottleneck;
    throw py::value_error("block is '" + s + "', expected 'basic' or 'bottleneck'");
  }
  return h.cast<M::ResNetBlock>();
}

CocoImageRecord record_from_python(py::handle h, size_t i) {
  if (py::isinstance<CocoImageRecord>(h)) return h.cast<CocoImageRecord>();
  if (!py::isinstance<py::dict>(h)) {
    throw py::type_error("write_coco_detection: images[" + std::to_string(i) +
                         "] is " + py::str(py::type::of(h)).cast<std::string>() +
                         ", expected a CocoImageRecord or a dict with file_name, height, width, bbox, label");
  }
  py::dict d = py::reinterpret_borrow<py::dict>(h);
  CocoImageRecord r;
  for (const char* key : {"file_name", "height", "width"}) {
    if (!d.contains(key)) {
      throw py::value_error("write_coco_detection: images[" + std::to_string(i) + "] has no key '" + key + "'");
    }
  }
  r.file_name = d["file_name"].cast<std::string>();
  r.height = d["height"].cast<int64_t>();
  r.width = d["width"].cast<int64_t>();
  if (d.contains("bbox") && !d["bbox"].is_none()) r.bbox = array_from_python(d["bbox"], "write_coco_detection");
  if (d.contains("label") && !d["label"].is_none()) r.label = array_from_python(d["label"], "write_coco_detection");
  return r;
}

py::dict eval_result_to_python(const DetectionEvalResult& r) {
  py::dict d;
  const auto n_thresholds = static_cast<py::ssize_t>(r.ap.size());
  const auto n_classes = static_cast<py::ssize_t>(r.ap.empty() ? 0 : r.ap[0].size());
  py::array_t<double> ap({n_thresholds, n_classes});
  for (py::ssize_t t = 0; t < n_thresholds; ++t) {
    for (py::ssize_t k = 0; k < n_classes; ++k) {
      ap.mutable_at(t, k) = r.ap[static_cast<size_t>(t)][static_cast<size_t>(k)];
    }
  }
  d["ap"] = ap;
  d["map"] = py::array_t<double>(static_cast<py::ssize_t>(r.map.size()), r.map.data());
  py::list precision, recall;
  for (const auto& p : r.precision) precision.append(py::array_t<double>(static_cast<py::ssize_t>(p.size()), p.data()));
  for (const auto& p : r.recall) recall.append(py::array_t<double>(static_cast<py::ssize_t>(p.size()), p.data()));
  d["precision"] = precision;
  d["recall"] = recall;
  d["n_positives"] = py::array_t<int64_t>(static_cast<py::ssize_t>(r.n_positives.size()), r.n_positives.data());
  return d;
}

// Options (RetinaNetOptions, FasterRCNNOptions; `type` names it) of `options` (None: the
// defaults) with the keyword arguments set on them.
template <typename Options>
Options options_from_python(py::handle options, const py::kwargs& kwargs, const char* fn, const char* type) {
  Options o = options.is_none() ? Options() : options.cast<Options>();
  if (kwargs.empty()) return o;
  py::object self = py::cast(o);
  for (auto [key, value] : kwargs) {
    const std::string k = py::cast<std::string>(key);
    if (k.rfind('_', 0) == 0 || !py::hasattr(self, k.c_str())) {
      throw py::type_error(std::string(fn) + ": '" + k + "' is not an option of " + type);
    }
    self.attr(k.c_str()) = value;
  }
  return self.cast<Options>();
}

M::RetinaNetOptions retinanet_options(py::handle options, const py::kwargs& kwargs, const char* fn) {
  return options_from_python<M::RetinaNetOptions>(options, kwargs, fn, "RetinaNetOptions");
}

M::FasterRCNNOptions faster_rcnn_options(py::handle options, const py::kwargs& kwargs, const char* fn) {
  return options_from_python<M::FasterRCNNOptions>(options, kwargs, fn, "FasterRCNNOptions");
}

// Detections as ChainerCV's (bboxes, labels, scores) lists.
py::tuple detections_to_python(const M::Detections& d) {
  return py::make_tuple(arrays_to_python(d.bboxes), arrays_to_python(d.labels), arrays_to_python(d.scores));
}

void init_models(py::module_& models) {
  py::enum_<M::ResNetBlock>(models, "ResNetBlock", "A ResNet's residual block (Note [ResNet layout]).")
      .value("BASIC", M::ResNetBlock::kBasic)
      .value("BOTTLENECK", M::ResNetBlock::kBottleneck);

  py::class_<M::RetinaNetOptions>(models, "RetinaNetOptions",
                                  "How a RetinaNet is built, trained and read out (kusari/models/retinanet.h); "
                                  "every field is a keyword argument.")
      .def(py::init([](py::kwargs kwargs) { return retinanet_options(py::none(), kwargs, "RetinaNetOptions"); }))
      .def_readwrite("num_classes", &M::RetinaNetOptions::num_classes, "Object classes (without background).")
      .def_property(
          "block", [](const M::RetinaNetOptions& o) { return o.block; },
          [](M::RetinaNetOptions& o, py::handle h) { o.block = block_from_python(h); },
          "The backbone's block: ResNetBlock.BASIC or .BOTTLENECK (or 'basic', 'bottleneck').")
      .def_readwrite("blocks_per_stage", &M::RetinaNetOptions::blocks_per_stage)
      .def_readwrite("width", &M::RetinaNetOptions::width, "The backbone's base width.")
      .def_readwrite("fpn_channels", &M::RetinaNetOptions::fpn_channels)
      .def_readwrite("min_level", &M::RetinaNetOptions::min_level)
      .def_readwrite("max_level", &M::RetinaNetOptions::max_level)
      .def_readwrite("head_convs", &M::RetinaNetOptions::head_convs)
      .def_readwrite("anchor_scale", &M::RetinaNetOptions::anchor_scale)
      .def_readwrite("ratios", &M::RetinaNetOptions::ratios)
      .def_readwrite("scales", &M::RetinaNetOptions::scales)
      .def_readwrite("positive_iou", &M::RetinaNetOptions::positive_iou)
      .def_readwrite("negative_iou", &M::RetinaNetOptions::negative_iou)
      .def_readwrite("focal_alpha", &M::RetinaNetOptions::focal_alpha)
      .def_readwrite("focal_gamma", &M::RetinaNetOptions::focal_gamma)
      .def_readwrite("prior_probability", &M::RetinaNetOptions::prior_probability)
      .def_readwrite("score_threshold", &M::RetinaNetOptions::score_threshold)
      .def_readwrite("candidates_per_level", &M::RetinaNetOptions::candidates_per_level)
      .def_readwrite("nms_threshold", &M::RetinaNetOptions::nms_threshold)
      .def_readwrite("max_detections", &M::RetinaNetOptions::max_detections)
      .def("__repr__", [](const M::RetinaNetOptions& o) {
        return "RetinaNetOptions(num_classes=" + std::to_string(o.num_classes) + ", width=" + std::to_string(o.width) +
               ", fpn_channels=" + std::to_string(o.fpn_channels) + ", min_level=" + std::to_string(o.min_level) +
               ", max_level=" + std::to_string(o.max_level) + ")";
      });

  py::class_<M::RetinaNetLoss>(models, "RetinaNetLoss", "The parts of RetinaNet's loss.")
      .def_readonly("total", &M::RetinaNetLoss::total, "classification + regression")
      .def_readonly("classification", &M::RetinaNetLoss::classification, "The focal loss per positive.")
      .def_readonly("regression", &M::RetinaNetLoss::regression, "The smooth L1 loss per positive.")
      .def_readonly("positives", &M::RetinaNetLoss::positives, "Positive anchors in the batch.");

  py::class_<M::RetinaNetOutputs>(models, "RetinaNetOutputs", "The heads' outputs for every anchor of a batch.")
      .def_readonly("scores", &M::RetinaNetOutputs::scores, "(N, anchors, num_classes) logits")
      .def_readonly("locs", &M::RetinaNetOutputs::locs, "(N, anchors, 4) offsets from the anchors")
      .def_property_readonly("anchors", [](const M::RetinaNetOutputs& o) { return array_to_python(o.anchors.copy()); },
                             "float32 (anchors, 4); a copy (the model caches its anchors per size)")
      .def_readonly("anchors_per_level", &M::RetinaNetOutputs::anchors_per_level);

  py::class_<M::RetinaNet, Chain, std::shared_ptr<M::RetinaNet>>(models, "RetinaNet", py::dynamic_attr(),
                                                                 "RetinaNet (kusari/models/retinanet.h).")
      .def(py::init([](const M::RetinaNetOptions& options) {
             py::gil_scoped_release r;
             return std::make_shared<M::RetinaNet>(options);
           }),
           py::arg("options") = M::RetinaNetOptions())
      .def("outputs", [](M::RetinaNet& net, const VarArg& x) {
        py::gil_scoped_release r;
        return net.outputs(x.v);
      }, py::arg("x"), "The heads' outputs and the anchors for images x (N, 3, H, W).")
      .def("__call__", [](M::RetinaNet& net, const VarArg& x) {
        py::gil_scoped_release r;
        return net.outputs(x.v);
      }, py::arg("x"), "outputs(x).")
      .def("loss", [](M::RetinaNet& net, const VarArg& x, py::handle bboxes, py::handle labels) {
        const std::vector<Array> b = arrays_from_python(bboxes, "RetinaNet.loss");
        const std::vector<Array> l = arrays_from_python(labels, "RetinaNet.loss");
        py::gil_scoped_release r;
        return net.loss(x.v, b, l);
      }, py::arg("x"), py::arg("bboxes"), py::arg("labels"),
         "The loss of images x (N, 3, H, W) against each image's boxes (G_i, 4) and labels (G_i,): a "
         "RetinaNetLoss (total, classification, regression, positives).")
      .def("predict", [](M::RetinaNet& net, const VarArg& x) {
        M::Detections d;
        {
          py::gil_scoped_release r;
          d = net.predict(x.v);
        }
        return detections_to_python(d);
      }, py::arg("x"),
         "(bboxes, labels, scores) of images x (N, 3, H, W), as ChainerCV's predict: lists of N NumPy arrays, "
         "float32 (R, 4), int32 (R,), float32 (R,) highest first. Builds no graph.")
      .def_property_readonly("options", &M::RetinaNet::options)
      .def_property_readonly("anchors_per_position", &M::RetinaNet::anchors_per_position)
      .def_readonly("backbone", &M::RetinaNet::backbone)
      .def_readonly("fpn", &M::RetinaNet::fpn)
      .def_readonly("classification_head", &M::RetinaNet::classification_head)
      .def_readonly("regression_head", &M::RetinaNet::regression_head);

  models.def("retinanet_resnet50_fpn", [](py::handle options, py::kwargs kwargs) {
    const M::RetinaNetOptions o = retinanet_options(options, kwargs, "retinanet_resnet50_fpn");
    py::gil_scoped_release r;
    return M::retinanet_resnet50_fpn(o);
  }, py::arg("options") = py::none(),
     "RetinaNet with a ResNet-50 backbone and levels 3 ... 7; `options` (or keyword arguments of "
     "RetinaNetOptions) give the classes and any other setting.");

  py::class_<M::FasterRCNNOptions>(models, "FasterRCNNOptions",
                                   "How a Faster R-CNN is built, trained and read out (kusari/models/faster_rcnn.h; "
                                   "torchvision's defaults); every field is a keyword argument.")
      .def(py::init([](py::kwargs kwargs) { return faster_rcnn_options(py::none(), kwargs, "FasterRCNNOptions"); }))
      .def_readwrite("num_classes", &M::FasterRCNNOptions::num_classes, "Object classes (without background).")
      .def_property(
          "block", [](const M::FasterRCNNOptions& o) { return o.block; },
          [](M::FasterRCNNOptions& o, py::handle h) { o.block = block_from_python(h); },
          "The backbone's block: ResNetBlock.BASIC or .BOTTLENECK (or 'basic', 'bottleneck').")
      .def_readwrite("blocks_per_stage", &M::FasterRCNNOptions::blocks_per_stage)
      .def_readwrite("width", &M::FasterRCNNOptions::width, "The backbone's base width.")
      .def_readwrite("fpn_channels", &M::FasterRCNNOptions::fpn_channels)
      .def_readwrite("min_level", &M::FasterRCNNOptions::min_level)
      .def_readwrite("max_level", &M::FasterRCNNOptions::max_level)
      .def_readwrite("anchor_sizes", &M::FasterRCNNOptions::anchor_sizes, "One anchor size per level.")
      .def_readwrite("ratios", &M::FasterRCNNOptions::ratios)
      .def_readwrite("rpn_pre_nms_top_n_train", &M::FasterRCNNOptions::rpn_pre_nms_top_n_train)
      .def_readwrite("rpn_pre_nms_top_n_test", &M::FasterRCNNOptions::rpn_pre_nms_top_n_test)
      .def_readwrite("rpn_post_nms_top_n_train", &M::FasterRCNNOptions::rpn_post_nms_top_n_train)
      .def_readwrite("rpn_post_nms_top_n_test", &M::FasterRCNNOptions::rpn_post_nms_top_n_test)
      .def_readwrite("rpn_nms_threshold", &M::FasterRCNNOptions::rpn_nms_threshold)
      .def_readwrite("rpn_min_size", &M::FasterRCNNOptions::rpn_min_size)
      .def_readwrite("rpn_positive_iou", &M::FasterRCNNOptions::rpn_positive_iou)
      .def_readwrite("rpn_negative_iou", &M::FasterRCNNOptions::rpn_negative_iou)
      .def_readwrite("rpn_batch_size_per_image", &M::FasterRCNNOptions::rpn_batch_size_per_image)
      .def_readwrite("rpn_positive_fraction", &M::FasterRCNNOptions::rpn_positive_fraction)
      .def_readwrite("roi_positive_iou", &M::FasterRCNNOptions::roi_positive_iou)
      .def_readwrite("roi_batch_size_per_image", &M::FasterRCNNOptions::roi_batch_size_per_image)
      .def_readwrite("roi_positive_fraction", &M::FasterRCNNOptions::roi_positive_fraction)
      .def_readwrite("roi_output_size", &M::FasterRCNNOptions::roi_output_size)
      .def_readwrite("roi_sampling_ratio", &M::FasterRCNNOptions::roi_sampling_ratio)
      .def_readwrite("canonical_scale", &M::FasterRCNNOptions::canonical_scale)
      .def_readwrite("canonical_level", &M::FasterRCNNOptions::canonical_level)
      .def_readwrite("representation_size", &M::FasterRCNNOptions::representation_size)
      .def_readwrite("box_coder_weights", &M::FasterRCNNOptions::box_coder_weights)
      .def_readwrite("score_threshold", &M::FasterRCNNOptions::score_threshold)
      .def_readwrite("nms_threshold", &M::FasterRCNNOptions::nms_threshold)
      .def_readwrite("max_detections", &M::FasterRCNNOptions::max_detections)
      .def("__repr__", [](const M::FasterRCNNOptions& o) {
        return "FasterRCNNOptions(num_classes=" + std::to_string(o.num_classes) + ", width=" + std::to_string(o.width) +
               ", fpn_channels=" + std::to_string(o.fpn_channels) + ", min_level=" + std::to_string(o.min_level) +
               ", max_level=" + std::to_string(o.max_level) + ")";
      });

  py::class_<M::FasterRCNNLoss>(models, "FasterRCNNLoss", "The parts of Faster R-CNN's loss.")
      .def_readonly("total", &M::FasterRCNNLoss::total, "The sum of the four parts")
      .def_readonly("rpn_objectness", &M::FasterRCNNLoss::rpn_objectness,
                    "Sigmoid cross entropy of the sampled anchors")
      .def_readonly("rpn_loc", &M::FasterRCNNLoss::rpn_loc, "Smooth L1 of the sampled positive anchors' offsets")
      .def_readonly("roi_cls", &M::FasterRCNNLoss::roi_cls, "Softmax cross entropy of the sampled RoIs")
      .def_readonly("roi_loc", &M::FasterRCNNLoss::roi_loc, "Smooth L1 of the foreground RoIs' own-class offsets");

  py::class_<M::FasterRCNN, Chain, std::shared_ptr<M::FasterRCNN>>(models, "FasterRCNN", py::dynamic_attr(),
                                                                   "Faster R-CNN with a feature pyramid "
                                                                   "(kusari/models/faster_rcnn.h).")
      .def(py::init([](const M::FasterRCNNOptions& options) {
             py::gil_scoped_release r;
             return std::make_shared<M::FasterRCNN>(options);
           }),
           py::arg("options") = M::FasterRCNNOptions())
      .def("loss", [](M::FasterRCNN& net, const VarArg& x, py::handle bboxes, py::handle labels) {
        const std::vector<Array> b = arrays_from_python(bboxes, "FasterRCNN.loss");
        const std::vector<Array> l = arrays_from_python(labels, "FasterRCNN.loss");
        py::gil_scoped_release r;
        return net.loss(x.v, b, l);
      }, py::arg("x"), py::arg("bboxes"), py::arg("labels"),
         "The loss of images x (N, 3, H, W) against each image's boxes (G_i, 4) and labels (G_i,): a "
         "FasterRCNNLoss (total, rpn_objectness, rpn_loc, roi_cls, roi_loc).")
      .def("predict", [](M::FasterRCNN& net, const VarArg& x) {
        M::Detections d;
        {
          py::gil_scoped_release r;
          d = net.predict(x.v);
        }
        return detections_to_python(d);
      }, py::arg("x"),
         "(bboxes, labels, scores) of images x (N, 3, H, W) in test mode, as ChainerCV's predict: lists of N "
         "NumPy arrays. Builds no graph.")
      .def("proposals", [](M::FasterRCNN& net, const VarArg& x, bool training) {
        std::vector<Array> p;
        {
          py::gil_scoped_release r;
          NoBackpropMode no_graph;
          const M::RPNOutputs rpn = net.rpn_outputs(net.features(x.v));
          p = net.proposals(rpn, x.v.shape()[2], x.v.shape()[3], training);
        }
        return arrays_to_python(p);
      }, py::arg("x"), py::arg("training") = false,
         "Each image's region proposals (P_i, 4), best first, with the training or the test top-ks.")
      .def_property_readonly("options", &M::FasterRCNN::options)
      .def_property_readonly("anchors_per_position", &M::FasterRCNN::anchors_per_position)
      .def_readonly("backbone", &M::FasterRCNN::backbone)
      .def_readonly("fpn", &M::FasterRCNN::fpn)
      .def_readonly("rpn_head", &M::FasterRCNN::rpn_head)
      .def_readonly("box_head", &M::FasterRCNN::box_head);

  models.def("faster_rcnn_resnet50_fpn", [](py::handle options, py::kwargs kwargs) {
    const M::FasterRCNNOptions o = faster_rcnn_options(options, kwargs, "faster_rcnn_resnet50_fpn");
    py::gil_scoped_release r;
    return M::faster_rcnn_resnet50_fpn(o);
  }, py::arg("options") = py::none(),
     "Faster R-CNN with a ResNet-50 backbone and levels 2 ... 6 (torchvision's layout); `options` (or keyword "
     "arguments of FasterRCNNOptions) give the classes and any other setting.");
  models.def("fpn_roi_levels", [](py::handle rois, int min_level, int max_level, double canonical_scale,
                                  int canonical_level) {
    return M::fpn_roi_levels(array_from_python(rois, "fpn_roi_levels"), min_level, max_level, canonical_scale,
                             canonical_level);
  }, py::arg("rois"), py::arg("min_level"), py::arg("max_level"), py::arg("canonical_scale") = 224.0,
     py::arg("canonical_level") = 4, "The pyramid level of each RoI (R, 4) (Note [FPN level of a RoI]).");

  models.def("generate_anchors", [](int64_t height, int64_t width, double stride, double size,
                                    const std::vector<double>& ratios, const std::vector<double>& scales,
                                    py::handle device) {
    const Device dev = device_from_python(device, "generate_anchors");
    Array a;
    {
      py::gil_scoped_release r;
      a = M::generate_anchors(height, width, stride, size, ratios, scales, dev);
    }
    return array_to_python(a);
  }, py::arg("height"), py::arg("width"), py::arg("stride"), py::arg("size"),
     py::arg("ratios") = std::vector<double>{0.5, 1.0, 2.0}, py::arg("scales") = std::vector<double>{1.0},
     py::arg("device") = py::none(),
     "The anchors of a (height, width) feature map of stride `stride`: float32 (height * width * ratios * "
     "scales, 4), by position (row-major), ratio, scale.");
  models.def("match_anchors", [](py::handle anchors, py::handle bbox, py::handle label, double positive_iou,
                                 double negative_iou, bool low_quality_matches) {
    const Array a = array_from_python(anchors, "match_anchors");
    const Array b = array_from_python(bbox, "match_anchors");
    const Array l = array_from_python(label, "match_anchors");
    M::AnchorTargets t;
    {
      py::gil_scoped_release r;
      t = M::match_anchors(a, b, l, positive_iou, negative_iou, low_quality_matches);
    }
    return py::make_tuple(array_to_python(t.labels), array_to_python(t.locs), array_to_python(t.matched));
  }, py::arg("anchors"), py::arg("bbox"), py::arg("label"), py::arg("positive_iou") = 0.5,
     py::arg("negative_iou") = 0.4, py::arg("low_quality_matches") = true,
     "(labels, locs, matched) of anchors (A, 4) matched to boxes bbox (G, 4) of classes label (G,): int32 (A,) "
     "class of a positive, -1 background, -2 ignored; float32 (A, 4) offsets; int32 (A,) matched box or -1.");

  models.def("eval_detection", [](py::handle pred_bboxes, py::handle pred_labels, py::handle pred_scores,
                                  py::handle gt_bboxes, py::handle gt_labels, py::handle gt_difficults,
                                  int64_t n_classes, const std::vector<double>& iou_thresholds,
                                  bool use_07_metric, bool coco_interpolation, bool coco_matching) {
    const char* fn = "eval_detection";
    const auto pb = arrays_from_python(pred_bboxes, fn), pl = arrays_from_python(pred_labels, fn),
               ps = arrays_from_python(pred_scores, fn), gb = arrays_from_python(gt_bboxes, fn),
               gl = arrays_from_python(gt_labels, fn), gd = arrays_from_python(gt_difficults, fn);
    DetectionEvalOptions o;
    o.iou_thresholds = iou_thresholds;
    o.use_07_metric = use_07_metric;
    o.coco_interpolation = coco_interpolation;
    o.coco_matching = coco_matching;
    DetectionEvalResult res;
    {
      py::gil_scoped_release r;
      res = eval_detection(pb, pl, ps, gb, gl, gd, n_classes, o);
    }
    return eval_result_to_python(res);
  }, py::arg("pred_bboxes"), py::arg("pred_labels"), py::arg("pred_scores"), py::arg("gt_bboxes"),
     py::arg("gt_labels"), py::arg("gt_difficults") = py::none(), py::arg("n_classes") = -1,
     py::arg("iou_thresholds") = std::vector<double>{0.5}, py::arg("use_07_metric") = false,
     py::arg("coco_interpolation") = false, py::arg("coco_matching") = false,
     "AP of every class and mAP (Note [Detection mAP]) of per-image predictions against the ground truth: a dict "
     "with 'ap' float64 (thresholds, classes) (NaN for a class without ground truth), 'map' (thresholds,), and, "
     "at the first threshold, 'precision' and 'recall' (a list of arrays per class) and 'n_positives'.");
  models.def("detection_scores", [](py::handle pred_bboxes, py::handle pred_labels, py::handle pred_scores,
                                    py::handle gt_bboxes, py::handle gt_labels, py::handle gt_difficults,
                                    int64_t n_classes) {
    const char* fn = "detection_scores";
    const auto pb = arrays_from_python(pred_bboxes, fn), pl = arrays_from_python(pred_labels, fn),
               ps = arrays_from_python(pred_scores, fn), gb = arrays_from_python(gt_bboxes, fn),
               gl = arrays_from_python(gt_labels, fn), gd = arrays_from_python(gt_difficults, fn);
    DetectionScores s;
    {
      py::gil_scoped_release r;
      s = detection_scores(pb, pl, ps, gb, gl, gd, n_classes);
    }
    py::dict d;
    d["map50"] = s.map50;
    d["coco_map"] = s.coco_map;
    return d;
  }, py::arg("pred_bboxes"), py::arg("pred_labels"), py::arg("pred_scores"), py::arg("gt_bboxes"),
     py::arg("gt_labels"), py::arg("gt_difficults") = py::none(), py::arg("n_classes") = -1,
     "{'map50': mAP at IoU 0.5 (VOC), 'coco_map': COCO's mAP over IoU 0.50:0.05:0.95}.");
}

void init_datasets(py::module_& data) {
  py::class_<CocoDetectionDataset, Dataset, std::shared_ptr<CocoDetectionDataset>>(
      data, "CocoDetectionDataset",
      "A COCO-style detection dataset: example i is (uint8 (H, W, C) image, float32 (R, 4) bbox (y_min, x_min, "
      "y_max, x_max), int32 (R,) label), the image decoded when read.")
      .def(py::init([](const std::string& annotation_json, const std::string& image_root, int channels,
                       bool skip_crowd, bool skip_images_without_boxes) {
             DecodeOptions d;
             d.channels = channels;
             CocoDetectionOptions o;
             o.skip_crowd = skip_crowd;
             o.skip_images_without_boxes = skip_images_without_boxes;
             py::gil_scoped_release r;
             return std::make_shared<CocoDetectionDataset>(annotation_json, image_root, d, o);
           }),
           py::arg("annotation_json"), py::arg("image_root"), py::arg("channels") = 3, py::kw_only(),
           py::arg("skip_crowd") = true, py::arg("skip_images_without_boxes") = false)
      .def("path", &CocoDetectionDataset::path, py::arg("i"), "The full path of image i.")
      .def("boxes", [](const CocoDetectionDataset& d, int64_t i) { return array_to_python(d.boxes(i)); },
           py::arg("i"), "The boxes of image i, without decoding it.")
      .def("labels", [](const CocoDetectionDataset& d, int64_t i) { return array_to_python(d.labels(i)); },
           py::arg("i"), "The labels of image i, without decoding it.")
      .def("image_id", &CocoDetectionDataset::image_id, py::arg("i"))
      .def("category_id", &CocoDetectionDataset::category_id, py::arg("label"))
      .def_property_readonly("classes", &CocoDetectionDataset::classes);

  py::class_<CocoImageRecord>(data, "CocoImageRecord", "One image of a detection dataset to write.")
      .def(py::init([](const std::string& file_name, int64_t height, int64_t width, py::handle bbox,
                       py::handle label) {
             CocoImageRecord r;
             r.file_name = file_name;
             r.height = height;
             r.width = width;
             if (!bbox.is_none()) r.bbox = array_from_python(bbox, "CocoImageRecord");
             if (!label.is_none()) r.label = array_from_python(label, "CocoImageRecord");
             return r;
           }),
           py::arg("file_name"), py::arg("height"), py::arg("width"), py::arg("bbox") = py::none(),
           py::arg("label") = py::none())
      .def_readwrite("file_name", &CocoImageRecord::file_name)
      .def_readwrite("height", &CocoImageRecord::height)
      .def_readwrite("width", &CocoImageRecord::width)
      .def_property_readonly("bbox", [](const CocoImageRecord& r) { return array_to_python(r.bbox); })
      .def_property_readonly("label", [](const CocoImageRecord& r) { return array_to_python(r.label); });

  data.def("write_coco_detection", [](const std::string& annotation_json, py::handle images,
                                      const std::vector<std::string>& class_names) {
    std::vector<CocoImageRecord> records;
    size_t i = 0;
    for (py::handle h : images) records.push_back(record_from_python(h, i++));
    py::gil_scoped_release r;
    write_coco_detection(annotation_json, records, class_names);
  }, py::arg("annotation_json"), py::arg("images"), py::arg("class_names"),
     "Writes a COCO instances JSON file for `images` (CocoImageRecords, or dicts with file_name, height, width, "
     "bbox, label); label k becomes category id k + 1 named class_names[k].");

  py::class_<SyntheticDetectionSet>(data, "SyntheticDetectionSet", "Synthetic detection pictures and annotations.")
      .def_property_readonly("images", [](const SyntheticDetectionSet& s) {
        py::list out;
        for (const Image& img : s.images) out.append(array_to_python(image_to_array(img)));
        return out;
      }, "uint8 (size, size, 3) pictures")
      .def_readonly("records", &SyntheticDetectionSet::records, "One CocoImageRecord per picture.")
      .def_readonly("class_names", &SyntheticDetectionSet::class_names);
  data.def("make_synthetic_detection_images", [](int64_t count, int64_t size, int64_t max_objects, uint64_t seed,
                                                 uint64_t split) {
    SyntheticDetectionOptions o;
    o.size = size;
    o.max_objects = max_objects;
    o.seed = seed;
    o.split = split;
    py::gil_scoped_release r;
    return make_synthetic_detection_images(count, o);
  }, py::arg("count"), py::arg("size") = 64, py::arg("max_objects") = 3, py::arg("seed") = 0,
     py::arg("split") = 0,
     "`count` pictures of squares (label 0), disks (1) and triangles (2) on grey backgrounds, the same for a "
     "(seed, split) on every platform.");

  // --- box-aware augmentation (Note [Box-aware augmentation])
  data.def("flip_bbox", [](const ArrArg& bbox, int64_t height, int64_t width, bool y_flip, bool x_flip) {
    Array out;
    {
      py::gil_scoped_release r;
      out = flip_bbox(bbox.a, height, width, y_flip, x_flip);
    }
    return array_to_python(out);
  }, py::arg("bbox"), py::arg("height"), py::arg("width"), py::arg("y_flip") = false, py::arg("x_flip") = true,
     "bbox (R, 4) of a height x width picture flipped (ChainerCV's flip_bbox): float32 (R, 4).");
  data.def("resize_bbox", [](const ArrArg& bbox, std::array<int64_t, 2> in_size, std::array<int64_t, 2> out_size) {
    Array out;
    {
      py::gil_scoped_release r;
      out = resize_bbox(bbox.a, in_size, out_size);
    }
    return array_to_python(out);
  }, py::arg("bbox"), py::arg("in_size"), py::arg("out_size"),
     "bbox (R, 4) of a picture of in_size (H, W) scaled to out_size (ChainerCV's resize_bbox): float32 (R, 4).");
  data.def("clip_bbox", [](const ArrArg& bbox, const ArrArg& label, int64_t height, int64_t width) {
    std::pair<Array, Array> out;
    {
      py::gil_scoped_release r;
      out = clip_bbox(bbox.a, label.a, height, width);
    }
    return py::make_tuple(array_to_python(out.first), array_to_python(out.second));
  }, py::arg("bbox"), py::arg("label"), py::arg("height"), py::arg("width"),
     "(bbox, label) clipped to a height x width picture, without the boxes left with no area.");
  data.def("flip_detection", [](py::handle image, py::handle bbox, py::handle label, bool y_flip, bool x_flip) {
    const DetectionExample in = example_from_python(image, bbox, label, "flip_detection");
    DetectionExample out;
    {
      py::gil_scoped_release r;
      out = flip_detection(in, y_flip, x_flip);
    }
    return example_to_python(out);
  }, py::arg("image"), py::arg("bbox"), py::arg("label"), py::arg("y_flip") = false, py::arg("x_flip") = true,
     "(image, bbox, label) mirrored, boxes with the picture, then clipped.");
  data.def("random_flip_detection", [](py::handle image, py::handle bbox, py::handle label, double p,
                                       py::handle seed) {
    const DetectionExample in = example_from_python(image, bbox, label, "random_flip_detection");
    Generator g = generator_of(seed);
    DetectionExample out;
    {
      py::gil_scoped_release r;
      out = random_flip_detection(in, g, p);
    }
    return example_to_python(out);
  }, py::arg("image"), py::arg("bbox"), py::arg("label"), py::arg("p") = 0.5, py::kw_only(),
     py::arg("seed") = py::none(),
     "flip_detection with probability p; the draw comes from Generator(seed), or from the default generator "
     "(kusari.manual_seed) without a seed.");
  data.def("resize_detection", [](py::handle image, py::handle bbox, py::handle label, int64_t height,
                                  int64_t width) {
    const DetectionExample in = example_from_python(image, bbox, label, "resize_detection");
    DetectionExample out;
    {
      py::gil_scoped_release r;
      out = resize_detection(in, height, width);
    }
    return example_to_python(out);
  }, py::arg("image"), py::arg("bbox"), py::arg("label"), py::arg("height"), py::arg("width"),
     "(image, bbox, label) resized to height x width (bilinear), boxes scaled by the exact factors, then clipped.");
  data.def("fit_size", [](int64_t height, int64_t width, int64_t max_height, int64_t max_width) {
    const std::array<int64_t, 2> s = fit_size(height, width, max_height, max_width);
    return py::make_tuple(s[0], s[1]);
  }, py::arg("height"), py::arg("width"), py::arg("max_height"), py::arg("max_width"),
           "The size of a height x width picture scaled to fit in max_height x max_width keeping its aspect ratio.");
  data.def("resize_detection_to_fit", [](py::handle image, py::handle bbox, py::handle label, int64_t height,
                                         int64_t width, uint8_t fill) {
    const DetectionExample in = example_from_python(image, bbox, label, "resize_detection_to_fit");
    DetectionExample out;
    {
      py::gil_scoped_release r;
      out = resize_detection_to_fit(in, height, width, fill);
    }
    return example_to_python(out);
  }, py::arg("image"), py::arg("bbox"), py::arg("label"), py::arg("height"), py::arg("width"), py::arg("fill") = 0,
     "(image, bbox, label) scaled to fit_size and padded at the bottom and right with `fill` to height x width, "
     "to batch pictures of different sizes.");

  py::class_<DetectionAugmentOptions>(data, "DetectionAugmentOptions", "What augment_detection does.")
      .def(py::init([](double flip_probability, int64_t height, int64_t width, bool keep_aspect_ratio,
                       uint8_t fill) {
             DetectionAugmentOptions o;
             o.flip_probability = flip_probability;
             o.height = height;
             o.width = width;
             o.keep_aspect_ratio = keep_aspect_ratio;
             o.fill = fill;
             return o;
           }),
           py::kw_only(), py::arg("flip_probability") = 0.5, py::arg("height") = 0, py::arg("width") = 0,
           py::arg("keep_aspect_ratio") = true, py::arg("fill") = 0)
      .def_readwrite("flip_probability", &DetectionAugmentOptions::flip_probability)
      .def_readwrite("height", &DetectionAugmentOptions::height)
      .def_readwrite("width", &DetectionAugmentOptions::width)
      .def_readwrite("keep_aspect_ratio", &DetectionAugmentOptions::keep_aspect_ratio)
      .def_readwrite("fill", &DetectionAugmentOptions::fill);
  data.def("augment_detection", [](py::handle image, py::handle bbox, py::handle label,
                                   const DetectionAugmentOptions& options, py::handle seed) {
    const DetectionExample in = example_from_python(image, bbox, label, "augment_detection");
    Generator g = generator_of(seed);
    DetectionExample out;
    {
      py::gil_scoped_release r;
      out = augment_detection(in, options, g);
    }
    return example_to_python(out);
  }, py::arg("image"), py::arg("bbox"), py::arg("label"), py::arg("options"), py::kw_only(),
     py::arg("seed") = py::none(), "A random flip, then the resize `options` asks for.");

  py::class_<TransformedDetectionDataset, Dataset, std::shared_ptr<TransformedDetectionDataset>>(
      data, "TransformedDetectionDataset",
      "A detection dataset augmented as it is read (Note [Seeded detection augmentation]): the n-th read of "
      "example i draws from a generator seeded with (seed, n, i).")
      .def(py::init([](py::handle dataset, const DetectionAugmentOptions& options, uint64_t seed) {
             return std::make_shared<TransformedDetectionDataset>(
                 dataset_from_python(dataset, "TransformedDetectionDataset"), options, seed);
           }),
           py::arg("dataset"), py::arg("options"), py::arg("seed") = 0)
      .def("example", [](const TransformedDetectionDataset& d, int64_t i, uint64_t draw) {
        Example e;
        {
          py::gil_scoped_release r;
          e = d.example(i, draw);
        }
        return py::make_tuple(array_to_python(e[0]), array_to_python(e[1]), array_to_python(e[2]));
      }, py::arg("i"), py::arg("draw"), "Example i with the draws of its read `draw`, without counting a read.")
      .def("reset_draws", &TransformedDetectionDataset::reset_draws)
      .def_property_readonly("dataset", [](const TransformedDetectionDataset& d) {
        return dataset_to_python(std::const_pointer_cast<Dataset>(d.base()));
      })
      .def_property_readonly("seed", &TransformedDetectionDataset::seed);
}

}  // namespace

void init_detection(py::module_& m) {
  py::module_ models = m.attr("links").attr("models");
  init_models(models);
  py::module_ data = m.attr("data");
  init_datasets(data);
}

}  // namespace kusari::python
