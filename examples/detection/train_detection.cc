// Data-parallel object detection: a RetinaNet (models/retinanet.h) or a Faster R-CNN
// (models/faster_rcnn.h) trained on a COCO-style detection dataset (an instances JSON file and a
// folder of images), evaluated by mAP@0.5 and COCO's mAP over all ranks' shards of the
// validation set. Try it on a synthetic set:
//
//   make_detection_set --out shapes --train 400 --val 100 --size 64
//   mpiexec -n 2 ./train_detection --data shapes --backbone tiny -e 20        # CPUs
//   mpiexec -n 2 ./train_detection --data shapes --backbone tiny --model faster_rcnn
//   mpiexec -n 8 ./train_detection --data coco --backbone resnet50 --gpu       # one GPU per
//   process
//
// --data DIR reads DIR/annotations/instances_train.json with the images of DIR/train, and
// instances_val.json with DIR/val (the layout make_detection_set writes, and COCO's with the
// folders renamed). The images of a batch must have one size: --fit-size N resizes pictures of
// any size to fit N x N (boxes too). --flip P flips each training picture and its boxes at random.
// The lines that make it multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "kusari/datasets/detection.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "kusari/models/detection_metrics.h"

namespace E = kusari::training::extensions;
namespace M = kusari::models;
using kusari::Array;
using kusari::Variable;

// A batch: images (N, 3, H, W) float32 scaled to about [-2, 2], and each image's boxes and labels.
struct Batch {
  Array images;
  std::vector<Array> bboxes, labels;
};

Batch convert(const std::vector<kusari::Example>& examples, kusari::Device device) {
  Batch b;
  std::vector<Array> images;
  for (const kusari::Example& ex : examples) {
    const Array& img = ex[0];  // uint8 (H, W, 3)
    if (!images.empty() && img.shape() != examples[0][0].shape()) {
      throw kusari::ShapeError("train_detection: the images of a batch must have one size, got " +
                               examples[0][0].shape().to_string() + " and " +
                               img.shape().to_string() + " (use --fit-size)");
    }
    images.push_back(((img.astype(kusari::float32) / 255.0 - 0.5) / 0.25).transpose({2, 0, 1}));
    b.bboxes.push_back(ex[1]);
    b.labels.push_back(ex[2]);
  }
  b.images = kusari::stack(images).to_device(device);
  return b;
}

// A detector of either kind, as the updater and the evaluation use it.
struct Detector {
  std::shared_ptr<kusari::Link> model;
  /// The loss of a batch; reports main/loss and its parts.
  std::function<Variable(const Batch&)> loss;
  /// The detections of images, in test mode.
  std::function<M::Detections(const Variable&)> predict;
  /// The names of the loss's parts, for PrintReport.
  std::vector<std::string> parts;
};

// One step per batch: the detector's loss of the batch (each process its own batch; the
// multi-node optimizer averages the gradients).
class DetectionUpdater : public kusari::training::StandardUpdater {
 public:
  DetectionUpdater(std::shared_ptr<kusari::Iterator> iterator,
                   std::shared_ptr<kusari::Optimizer> optimizer, Detector detector,
                   kusari::Device device)
      : StandardUpdater(std::move(iterator), std::move(optimizer), device),
        detector_(std::move(detector)) {}

  void update_core() override {
    const Batch b = convert(iterator_->next(), device_);
    optimizer_->update([&]() { return detector_.loss(b); });
  }

 private:
  Detector detector_;
};

// Appends the values of `a` (converted to float32) to `out`.
void append(std::vector<float>& out, const Array& a) {
  const std::vector<float> v =
      a.astype(kusari::float32).to_device(kusari::Device::cpu()).to_vector<float>();
  out.insert(out.end(), v.begin(), v.end());
}

// Detects the objects of this process's validation shard, gathers every process's detections and
// ground truth (multi-node), and reports mAP@0.5 and COCO's mAP as validation/main/map and
// validation/main/map_coco. Every process gets the same numbers.
void evaluate(const Detector& detector, const std::shared_ptr<kusari::Dataset>& val, int batchsize,
              kusari::Device device, const std::shared_ptr<kusari::mn::Communicator>& comm,
              int64_t classes) {
  // Per image: R, G, then R rows of (box, label, score) and G rows of (box, label).
  std::vector<float> mine;
  kusari::SerialIterator it(val, batchsize, /*repeat=*/false, /*shuffle=*/false);
  for (;;) {
    const std::vector<kusari::Example> examples = it.next();
    if (examples.empty()) break;
    const Batch b = convert(examples, device);
    const M::Detections d = detector.predict(Variable(b.images));
    for (size_t i = 0; i < examples.size(); ++i) {
      const int64_t r = d.bboxes[i].shape()[0], g = b.bboxes[i].shape()[0];
      mine.push_back(static_cast<float>(r));
      mine.push_back(static_cast<float>(g));
      const Array pred =
          kusari::concatenate({d.bboxes[i], d.labels[i].astype(kusari::float32).reshape({r, 1}),
                               d.scores[i].reshape({r, 1})},
                              1);
      append(mine, pred);
      append(mine, kusari::concatenate({b.bboxes[i].astype(kusari::float32),
                                        b.labels[i].astype(kusari::float32).reshape({g, 1})},
                                       1));
    }
  }
  kusari::mn::Bytes bytes(mine.size() * sizeof(float));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<Array> pb, pl, ps, gb, gl;
  for (const kusari::mn::Bytes& part : comm->allgather_obj(bytes)) {  // (multi-node)
    std::vector<float> v(part.size() / sizeof(float));
    std::memcpy(v.data(), part.data(), part.size());
    for (size_t k = 0; k < v.size();) {
      const int64_t r = static_cast<int64_t>(v[k]), g = static_cast<int64_t>(v[k + 1]);
      k += 2;
      const Array pred = Array::from_vector(
          std::vector<float>(v.begin() + k, v.begin() + k + 6 * r), kusari::Shape{r, 6});
      k += static_cast<size_t>(6 * r);
      const Array truth = Array::from_vector(
          std::vector<float>(v.begin() + k, v.begin() + k + 5 * g), kusari::Shape{g, 5});
      k += static_cast<size_t>(5 * g);
      pb.push_back(pred.at({kusari::Slice(), kusari::Slice(0, 4)}).copy());
      pl.push_back(pred.at({kusari::Slice(), 4}).astype(kusari::int32));
      ps.push_back(pred.at({kusari::Slice(), 5}).copy());
      gb.push_back(truth.at({kusari::Slice(), kusari::Slice(0, 4)}).copy());
      gl.push_back(truth.at({kusari::Slice(), 4}).astype(kusari::int32));
    }
  }
  const kusari::DetectionScores s = kusari::detection_scores(pb, pl, ps, gb, gl, {}, classes);
  kusari::report_scalar("validation/main/map", s.map50);
  kusari::report_scalar("validation/main/map_coco", s.coco_map);
}

// The RetinaNet a --backbone name stands for.
M::RetinaNetOptions retinanet_options(const std::string& backbone, int64_t classes) {
  M::RetinaNetOptions o;
  o.num_classes = classes;
  if (backbone == "tiny") {  // for small pictures on CPUs: levels 3-5, anchors of 2 strides
    o.block = M::ResNetBlock::kBasic;
    o.blocks_per_stage = {1, 1, 1, 1};
    o.width = 16;
    o.fpn_channels = 32;
    o.head_convs = 2;
    o.max_level = 5;
    o.anchor_scale = 2.0;
  } else if (backbone == "resnet18") {
    o.block = M::ResNetBlock::kBasic;
    o.blocks_per_stage = {2, 2, 2, 2};
  }  // resnet50: the defaults (the paper's RetinaNet)
  return o;
}

// The Faster R-CNN a --backbone name stands for.
M::FasterRCNNOptions faster_rcnn_options(const std::string& backbone, int64_t classes) {
  M::FasterRCNNOptions o;
  o.num_classes = classes;
  if (backbone == "tiny") {  // for small pictures on CPUs: levels 2-5, anchors of 3 strides
    o.block = M::ResNetBlock::kBasic;
    o.blocks_per_stage = {1, 1, 1, 1};
    o.width = 16;
    o.fpn_channels = 32;
    o.max_level = 5;
    o.anchor_sizes = {12, 24, 48, 96};
    o.rpn_pre_nms_top_n_train = o.rpn_pre_nms_top_n_test = 300;
    o.rpn_post_nms_top_n_train = o.rpn_post_nms_top_n_test = 100;
    o.rpn_batch_size_per_image = 128;
    o.roi_batch_size_per_image = 64;
    o.representation_size = 256;
  } else if (backbone == "resnet18") {
    o.block = M::ResNetBlock::kBasic;
    o.blocks_per_stage = {2, 2, 2, 2};
  }  // resnet50: the defaults (torchvision's fasterrcnn_resnet50_fpn)
  return o;
}

// The detector `--model` names, with a `--backbone`.
Detector make_detector(const std::string& model, const std::string& backbone, int64_t classes) {
  Detector d;
  if (model == "faster_rcnn") {
    auto net = std::make_shared<M::FasterRCNN>(faster_rcnn_options(backbone, classes));
    d.model = net;
    d.loss = [net](const Batch& b) {
      M::FasterRCNNLoss l = net->loss(Variable(b.images), b.bboxes, b.labels);
      kusari::report({{"main/loss", l.total.array()},
                      {"main/loss/rpn_objectness", l.rpn_objectness.array()},
                      {"main/loss/rpn_loc", l.rpn_loc.array()},
                      {"main/loss/roi_cls", l.roi_cls.array()},
                      {"main/loss/roi_loc", l.roi_loc.array()}});
      return l.total;
    };
    d.predict = [net](const Variable& x) { return net->predict(x); };
    d.parts = {"main/loss/rpn_objectness", "main/loss/rpn_loc", "main/loss/roi_cls",
               "main/loss/roi_loc"};
  } else {
    auto net = std::make_shared<M::RetinaNet>(retinanet_options(backbone, classes));
    d.model = net;
    d.loss = [net](const Batch& b) {
      M::RetinaNetLoss l = net->loss(Variable(b.images), b.bboxes, b.labels);
      kusari::report({{"main/loss", l.total.array()},
                      {"main/loss/classification", l.classification.array()},
                      {"main/loss/regression", l.regression.array()}});
      return l.total;
    };
    d.predict = [net](const Variable& x) { return net->predict(x); };
    d.parts = {"main/loss/classification", "main/loss/regression"};
  }
  return d;
}

const CLI::Validator kPositive(
    [](std::string& v) {
      return std::atof(v.c_str()) > 0 ? std::string() : "must be positive, got " + v;
    },
    "POSITIVE");
const CLI::Validator kNonNegative(
    [](std::string& v) {
      return std::atof(v.c_str()) >= 0 ? std::string() : "must be 0 or more, got " + v;
    },
    ">=0");

int main(int argc, char** argv) {
  CLI::App app{
      "kusari example: data-parallel object detection (RetinaNet, Faster R-CNN) on a COCO-style "
      "dataset"};
  int batchsize = 8, epoch = 20, seed = 0, threads = 0, eval_interval = 1, fit_size = 0;
  double lr = 1e-3, flip = 0.0;
  bool gpu = false, mnbn = false;
  std::string data, model_name = "retinanet", backbone = "resnet50", communicator = "pure_nccl",
                    out = "result", resume;
  app.add_option(
         "--data", data,
         "Dataset folder: annotations/instances_{train,val}.json and the images in train/ and val/")
      ->required();
  app.add_option("--model", model_name, "The detector: retinanet or faster_rcnn")
      ->capture_default_str()
      ->check(CLI::IsMember({"retinanet", "faster_rcnn"}));
  app.add_option("--backbone", backbone, "tiny (small pictures on CPUs), resnet18 or resnet50")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "resnet18", "resnet50"}));
  app.add_option("-b,--batchsize", batchsize, "Number of images in each mini-batch (per process)")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option(
         "--communicator", communicator,
         "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()
      ->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_option("-e,--epoch", epoch, "Number of sweeps over the dataset to train")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--eval-interval", eval_interval,
                 "Epochs between evaluations of the validation set")
      ->capture_default_str()
      ->check(kPositive);
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_flag("--mnbn", mnbn,
               "Multi-node batch normalization: the backbone's batch statistics over every "
               "process's batch, as PFDet");
  app.add_option("--lr", lr, "Adam's learning rate")->capture_default_str()->check(kPositive);
  app.add_option("--flip", flip,
                 "Probability of flipping a training picture and its boxes left to right")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--fit-size", fit_size,
                 "Resize every picture (and its boxes) to fit N x N, keeping its aspect ratio and "
                 "padding the rest, so that pictures of any size batch (0: as they are)")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option(
      "-r,--resume", resume,
      "Resume from a snapshot, e.g. result/snapshot_iter_600 (each process loads its own file)");
  app.add_option("--seed", seed, "Random seed of the weights and of the shuffling")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--threads", threads,
                 "BLAS threads per process on CPUs (0: the cores divided among the processes)")
      ->capture_default_str()
      ->check(kNonNegative);
  CLI11_PARSE(app, argc, argv);

  const bool cpu_communicator =
      communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(
        stderr,
        "Error: 'naive' communicator does not support GPU; use e.g. --communicator pure_nccl\n");
    return 1;
  }
  if (!gpu && !cpu_communicator) communicator = "naive";
  if (kusari::only_check_arguments("train_detection")) return 0;
  namespace fs = std::filesystem;
  const fs::path root(data);
  for (const fs::path& p : {root / "annotations" / "instances_train.json",
                            root / "annotations" / "instances_val.json"}) {
    if (!fs::is_regular_file(p)) {
      std::fprintf(stderr,
                   "Error: --data %s: there is no %s (make one with make_detection_set --out %s)\n",
                   data.c_str(), p.string().c_str(), data.c_str());
      return 1;
    }
  }

  auto comm = kusari::mn::create_communicator(communicator);  // (multi-node)
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  if (threads == 0)
    threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm->intra_size());
  kusari::set_blas_num_threads(threads);

  auto train_all = std::make_shared<kusari::CocoDetectionDataset>(
      (root / "annotations" / "instances_train.json").string(), (root / "train").string());
  auto val_all = std::make_shared<kusari::CocoDetectionDataset>(
      (root / "annotations" / "instances_val.json").string(), (root / "val").string());
  const int64_t classes = static_cast<int64_t>(train_all->classes().size());
  if (comm->rank() == 0) {
    std::printf("==========================================\n");
    std::printf("Num process (COMM_WORLD): %d\n", comm->size());
    if (gpu) std::printf("Using GPUs\n");
    std::printf("Using %s communicator\n", communicator.c_str());
    std::printf("Model: %s\n", model_name.c_str());
    std::printf("Backbone: %s\nClasses: %lld\nTrain images: %lld\nValidation images: %lld\n",
                backbone.c_str(), static_cast<long long>(classes),
                static_cast<long long>(train_all->size()), static_cast<long long>(val_all->size()));
    std::printf("Num Minibatch-size: %d\nNum epoch: %d\n", batchsize, epoch);
    std::printf("==========================================\n");
    std::fflush(stdout);
  }

  kusari::manual_seed(static_cast<uint64_t>(seed));
  const Detector detector = make_detector(model_name, backbone, classes);
  const std::shared_ptr<kusari::Link>& model = detector.model;
  if (mnbn) kusari::mn::create_mnbn_model(model, comm);  // (multi-node)
  model->to_device(device);
  auto optimizer = kusari::mn::create_multi_node_optimizer(  // (multi-node)
      std::make_shared<kusari::optimizers::Adam>(lr), comm);
  optimizer->setup(model);

  // Box-aware augmentation (datasets/detection.h): a random flip of each training picture read,
  // and pictures of any size fitted to one.
  std::shared_ptr<kusari::Dataset> train_set = train_all, val_set = val_all;
  if (flip > 0.0 || fit_size > 0) {
    kusari::DetectionAugmentOptions a;
    a.flip_probability = flip;
    a.height = a.width = fit_size;
    train_set = std::make_shared<kusari::TransformedDetectionDataset>(train_all, a,
                                                                      static_cast<uint64_t>(seed));
  }
  if (fit_size > 0) {
    kusari::DetectionAugmentOptions a;
    a.flip_probability = 0.0;
    a.height = a.width = fit_size;
    val_set = std::make_shared<kusari::TransformedDetectionDataset>(val_all, a);
  }

  // Each process trains on its shard and evaluates its part of the validation set.  (multi-node)
  auto train = kusari::mn::scatter_dataset(train_set, comm, 0, true, static_cast<uint64_t>(seed));
  auto val = kusari::mn::scatter_dataset(val_set, comm, 0, false, std::nullopt,
                                         /*force_equal_length=*/false);
  kusari::mn::check_same_settings(comm,
                                  {{"--batchsize", std::to_string(batchsize)},
                                   {"--epoch", std::to_string(epoch)},
                                   {"--model", model_name},
                                   {"--backbone", backbone},
                                   {"--lr", std::to_string(lr)},
                                   {"--seed", std::to_string(seed)},
                                   {"--eval-interval", std::to_string(eval_interval)},
                                   {"--flip", std::to_string(flip)},
                                   {"--fit-size", std::to_string(fit_size)},
                                   {"--communicator", communicator},
                                   {"--gpu", gpu ? "on" : "off"},
                                   {"--mnbn", mnbn ? "on" : "off"},
                                   {"--resume", resume.empty() ? "(none)" : "given"}},
                                  "train_detection");

  auto train_iter = std::make_shared<kusari::SerialIterator>(train, batchsize);
  auto updater = std::make_shared<DetectionUpdater>(train_iter, optimizer, detector, device);
  kusari::training::Trainer trainer(updater, kusari::training::interval(epoch, "epoch"), out);
  auto eval = kusari::training::make_extension(
      [detector, val, batchsize, device, comm, classes](kusari::training::Trainer&) {
        evaluate(detector, val, batchsize, device, comm, classes);
      },
      "detection_evaluator", kusari::training::interval(eval_interval, "epoch"),
      kusari::training::kPriorityWriter);  // before LogReport in the same iteration
  trainer.extend(eval);
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", kusari::training::interval(epoch, "epoch"));
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",  // (multi-node)
                   kusari::training::interval(epoch, "epoch"));
  }
  if (comm->rank() == 0) {
    trainer.extend(std::make_shared<E::LogReport>(
        std::nullopt, kusari::training::interval(eval_interval, "epoch")));
    std::vector<std::string> columns = {"epoch", "iteration", "main/loss"};
    columns.insert(columns.end(), detector.parts.begin(), detector.parts.end());
    columns.insert(columns.end(),
                   {"validation/main/map", "validation/main/map_coco", "elapsed_time"});
    trainer.extend(std::make_shared<E::PrintReport>(columns));
  }
  if (!resume.empty())
    kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
  trainer.run();
  return 0;
}
