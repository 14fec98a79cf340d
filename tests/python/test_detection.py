"""Object detection from Python: a tiny RetinaNet and a tiny Faster R-CNN trained a step and read out, anchors
and matching,
COCO-style files written and read back, mAP of hand-made boxes, and the box-aware augmentation."""

import math

import numpy as np
import pytest

import kusari
import kusari.datasets as D
import kusari.models as M


def tiny_options(num_classes):
    # tests/unit/models/retinanet_test.cc's tiny(): a width-8 ResNet-18-style backbone, levels 3-5.
    return M.RetinaNetOptions(num_classes=num_classes, block='basic', blocks_per_stage=[1, 1, 1, 1], width=8,
                              fpn_channels=16, head_convs=1, min_level=3, max_level=5, anchor_scale=2.0)


def two_pictures():
    """Two synthetic 64x64 pictures as a normalised (2, 3, 64, 64) batch, their boxes and labels in 0..1."""
    pictures = D.make_synthetic_detection_images(2, size=64, seed=1)
    x = np.stack([(img.astype(np.float32) / 255 - 0.5) / 0.25 for img in pictures.images]).transpose(0, 3, 1, 2)
    return x, [r.bbox for r in pictures.records], [np.minimum(r.label, 1) for r in pictures.records]


def test_retinanet_options_are_keyword_fields():
    o = tiny_options(3)
    assert o.num_classes == 3 and o.block == M.ResNetBlock.BASIC and o.blocks_per_stage == [1, 1, 1, 1]
    assert o.ratios == [0.5, 1.0, 2.0] and o.score_threshold == pytest.approx(0.05)
    o.block = 'bottleneck'
    assert o.block == M.ResNetBlock.BOTTLENECK
    with pytest.raises(TypeError, match="'no_such' is not an option"):
        M.RetinaNetOptions(no_such=1)
    with pytest.raises(ValueError, match="block is 'wide'"):
        M.RetinaNetOptions(block='wide')


def test_tiny_retinanet_trains_a_step_and_predicts():
    kusari.manual_seed(0)
    model = M.RetinaNet(tiny_options(2))
    assert isinstance(model, kusari.Chain) and model.anchors_per_position == 9
    x, bboxes, labels = two_pictures()
    opt = kusari.optimizers.Adam(alpha=1e-3)
    opt.setup(model)

    loss = model.loss(x, bboxes, labels)
    assert isinstance(loss, M.RetinaNetLoss) and loss.positives > 0
    assert loss.total.shape == () and math.isfinite(float(loss.total.array))
    np.testing.assert_allclose(float(loss.total.array),
                               float(loss.classification.array) + float(loss.regression.array), rtol=1e-5)
    model.cleargrads()
    loss.total.backward()
    assert all(p.grad is not None for _, p in model.namedparams())
    before = {name: np.array(p.array) for name, p in model.namedparams()}
    opt.update()
    assert any(not np.array_equal(before[name], p.array) for name, p in model.namedparams())

    out = model.outputs(x)
    assert out.scores.shape[0] == 2 and out.scores.shape[2] == 2 and out.locs.shape[2] == 4
    assert out.anchors.shape == (sum(out.anchors_per_level), 4)

    bb, ll, ss = model.predict(x)
    assert isinstance(bb, list) and len(bb) == len(ll) == len(ss) == 2
    for b, l, s in zip(bb, ll, ss):
        assert isinstance(b, np.ndarray) and b.dtype == np.float32 and b.ndim == 2 and b.shape[1] == 4
        assert l.dtype == np.int32 and l.shape == (b.shape[0],)
        assert s.dtype == np.float32 and s.shape == (b.shape[0],)
        assert np.all(np.diff(s) <= 0)


def tiny_faster_rcnn_options(num_classes):
    # tests/unit/models/faster_rcnn_test.cc's tiny(): levels 2-5, a few hundred proposals, a small box head.
    return M.FasterRCNNOptions(num_classes=num_classes, block='basic', blocks_per_stage=[1, 1, 1, 1], width=8,
                               fpn_channels=16, min_level=2, max_level=5, anchor_sizes=[16, 32, 64, 128],
                               rpn_pre_nms_top_n_train=200, rpn_pre_nms_top_n_test=200, rpn_post_nms_top_n_train=100,
                               rpn_post_nms_top_n_test=100, rpn_batch_size_per_image=64, roi_batch_size_per_image=64,
                               representation_size=64)


def test_tiny_faster_rcnn_trains_a_step_and_predicts():
    kusari.manual_seed(0)
    o = tiny_faster_rcnn_options(2)
    assert o.box_coder_weights == [10, 10, 5, 5] and o.roi_output_size == 7
    with pytest.raises(TypeError, match="'head_convs' is not an option of FasterRCNNOptions"):
        M.FasterRCNNOptions(head_convs=1)
    model = M.FasterRCNN(o)
    assert isinstance(model, kusari.Chain) and model.anchors_per_position == 3
    names = [n for n, _ in model.namedparams()]
    assert '/rpn/objectness/W' in names and '/box_head/fc6/W' in names and '/box_head/loc/b' in names
    x, bboxes, labels = two_pictures()
    opt = kusari.optimizers.Adam(alpha=1e-3)
    opt.setup(model)

    loss = model.loss(x, bboxes, labels)
    assert isinstance(loss, M.FasterRCNNLoss)
    parts = [float(p.array) for p in (loss.rpn_objectness, loss.rpn_loc, loss.roi_cls, loss.roi_loc)]
    assert all(math.isfinite(v) and v >= 0 for v in parts)
    np.testing.assert_allclose(float(loss.total.array), sum(parts), rtol=1e-5)
    model.cleargrads()
    loss.total.backward()
    before = {name: np.array(p.array) for name, p in model.namedparams()}
    opt.update()
    changed = [name for name, p in model.namedparams() if not np.array_equal(before[name], p.array)]
    assert any(n.startswith('/rpn/') for n in changed) and any(n.startswith('/box_head') for n in changed)

    proposals = model.proposals(x)
    assert len(proposals) == 2
    for p in proposals:
        assert p.dtype == np.float32 and p.ndim == 2 and p.shape[1] == 4 and 0 < p.shape[0] <= 100
        assert p.min() >= 0 and p[:, 2].max() <= 64 and p[:, 3].max() <= 64
    bb, ll, ss = model.predict(x)
    assert len(bb) == len(ll) == len(ss) == 2
    for b, l, s in zip(bb, ll, ss):
        assert b.dtype == np.float32 and b.shape[1:] == (4,) and l.dtype == np.int32 and s.shape == l.shape
        assert np.all(np.diff(s) <= 0) and (l.size == 0 or (l.min() >= 0 and l.max() < 2))
    with pytest.raises(Exception, match='FasterRCNN'):
        model.loss(x, bboxes, [np.array([5], np.int32), labels[1]])
    # Canonical levels: a 224-pixel RoI pools from level 4, a 112-pixel one from level 3.
    levels = M.fpn_roi_levels(np.array([[0, 0, 224, 224], [0, 0, 112, 112]], np.float32), 2, 5)
    assert list(levels) == [4, 3]


def test_generate_and_match_anchors():
    a = M.generate_anchors(2, 3, stride=8, size=16, ratios=[1.0], scales=[1.0])
    assert a.dtype == np.float32 and a.shape == (6, 4)
    np.testing.assert_allclose(a[0], [-4, -4, 12, 12])  # centred on (4, 4), 16 on a side
    np.testing.assert_allclose(a[4], [4, 4, 20, 20])  # row 1, column 1
    labels, locs, matched = M.match_anchors(a, np.array([[4, 4, 20, 20]], np.float32), np.array([2], np.int32))
    assert labels.dtype == np.int32 and labels.shape == (6,) and locs.shape == (6, 4)
    assert labels[4] == 2 and matched[4] == 0
    np.testing.assert_allclose(locs[4], 0, atol=1e-6)
    assert all(labels[i] in (-1, -2) for i in range(6) if i != 4)


def write_synthetic_set(folder, count=4):
    pictures = D.make_synthetic_detection_images(count, size=48, max_objects=2, seed=3)
    (folder / 'images').mkdir()
    for img, rec in zip(pictures.images, pictures.records):
        kusari.datasets.write_image(str(folder / 'images' / rec.file_name), img, quality=95)
    D.write_coco_detection(str(folder / 'instances.json'), pictures.records, pictures.class_names)
    return pictures


def test_a_synthetic_coco_set_reads_back(tmp_path):
    pictures = write_synthetic_set(tmp_path)
    assert pictures.class_names == ['square', 'disk', 'triangle']
    ds = D.CocoDetectionDataset(str(tmp_path / 'instances.json'), str(tmp_path / 'images'))
    assert len(ds) == 4 and ds.classes == ['square', 'disk', 'triangle'] and ds.category_id(2) == 3
    for i in range(len(ds)):
        image, bbox, label = ds[i]
        assert image.dtype == np.uint8 and image.shape == (48, 48, 3)
        np.testing.assert_array_equal(bbox, pictures.records[i].bbox)
        np.testing.assert_array_equal(label, pictures.records[i].label)
        np.testing.assert_array_equal(ds.boxes(i), bbox)
        assert ds.image_id(i) == i + 1 and ds.path(i).endswith(pictures.records[i].file_name)
    # Records may be dicts too.
    D.write_coco_detection(str(tmp_path / 'one.json'), [
        {'file_name': 'a.jpg', 'height': 10, 'width': 20, 'bbox': [[1, 2, 5, 8]], 'label': [1]}], ['x', 'y'])
    one = D.CocoDetectionDataset(str(tmp_path / 'one.json'), '')
    np.testing.assert_array_equal(one.boxes(0), [[1, 2, 5, 8]])
    with pytest.raises(OSError, match='missing.json'):
        D.CocoDetectionDataset(str(tmp_path / 'missing.json'), '')
    with pytest.raises(ValueError, match=r'write_coco_detection.*label\[0\] is 2'):
        D.write_coco_detection(str(tmp_path / 'bad.json'), [
            D.CocoImageRecord('a.jpg', 4, 4, np.zeros((1, 4), np.float32), np.array([2], np.int32))], ['x'])


def test_eval_detection_of_hand_made_boxes():
    gt_bboxes = [np.array([[0, 0, 10, 10], [20, 20, 30, 30]], np.float32), np.array([[5, 5, 15, 15]], np.float32)]
    gt_labels = [np.array([0, 1], np.int32), np.array([0], np.int32)]
    scores = [np.array([0.9, 0.8], np.float32), np.array([0.7], np.float32)]
    perfect = M.eval_detection(gt_bboxes, gt_labels, scores, gt_bboxes, gt_labels)
    np.testing.assert_allclose(perfect['ap'], [[1.0, 1.0]])
    np.testing.assert_allclose(perfect['map'], [1.0])
    np.testing.assert_array_equal(perfect['n_positives'], [2, 1])
    assert M.detection_scores(gt_bboxes, gt_labels, scores, gt_bboxes, gt_labels) == {'map50': 1.0, 'coco_map': 1.0}
    # Image 1's box moved off its object: class 0 finds one of its two boxes (recall 1/2 at precision 1,
    # then a false positive), so its AP is 0.5; class 1 keeps 1.
    moved = [gt_bboxes[0], np.array([[40, 40, 50, 50]], np.float32)]
    r = M.eval_detection(moved, gt_labels, scores, gt_bboxes, gt_labels)
    np.testing.assert_allclose(r['ap'], [[0.5, 1.0]])
    np.testing.assert_allclose(r['map'], [0.75])
    np.testing.assert_allclose(r['precision'][0], [1.0, 0.5])
    np.testing.assert_allclose(r['recall'][0], [0.5, 0.5])
    # A class without ground truth has AP NaN and is left out of the mean.
    r3 = M.eval_detection(gt_bboxes, gt_labels, scores, gt_bboxes, gt_labels, n_classes=3,
                          iou_thresholds=[0.5, 0.75])
    assert r3['ap'].shape == (2, 3) and np.isnan(r3['ap'][0, 2])
    np.testing.assert_allclose(r3['map'], [1.0, 1.0])
    with pytest.raises(ValueError, match='eval_detection'):
        M.eval_detection(gt_bboxes, gt_labels, scores[:1], gt_bboxes, gt_labels)


def picture(h, w, seed=0):
    return np.random.RandomState(seed).randint(0, 256, (h, w, 3)).astype(np.uint8)


def test_flips_move_the_boxes_with_the_pixels():
    image = picture(6, 10)
    bbox = np.array([[1, 2, 4, 5]], np.float32)
    label = np.array([7], np.int32)
    fi, fb, fl = D.flip_detection(image, bbox, label)
    np.testing.assert_array_equal(fi, image[:, ::-1])
    np.testing.assert_array_equal(fb, [[1, 5, 4, 8]])
    np.testing.assert_array_equal(fl, [7])
    np.testing.assert_array_equal(D.flip_bbox(bbox, 6, 10, y_flip=True, x_flip=False), [[2, 2, 5, 5]])
    back = D.flip_detection(fi, fb, fl)
    np.testing.assert_array_equal(back[0], image)
    np.testing.assert_array_equal(back[1], bbox)
    # Seeded random flips repeat; p = 1 always flips.
    a = [D.random_flip_detection(image, bbox, label, seed=s)[1] for s in range(20)]
    b = [D.random_flip_detection(image, bbox, label, seed=s)[1] for s in range(20)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert 0 < sum(np.array_equal(x, fb) for x in a) < 20
    np.testing.assert_array_equal(D.random_flip_detection(image, bbox, label, p=1.0)[1], fb)
    kusari.manual_seed(4)
    first = [D.random_flip_detection(image, bbox, label)[1] for _ in range(10)]
    kusari.manual_seed(4)
    again = [D.random_flip_detection(image, bbox, label)[1] for _ in range(10)]
    assert all(np.array_equal(x, y) for x, y in zip(first, again))


def test_resizes_scale_clip_and_drop_boxes():
    image = picture(10, 20)
    bbox = np.array([[2, 5, 6, 15], [12, 0, 15, 5], [-4, -4, 3, 3]], np.float32)
    label = np.array([1, 2, 3], np.int32)
    ri, rb, rl = D.resize_detection(image, bbox, label, 25, 8)
    assert ri.shape == (25, 8, 3) and ri.dtype == np.uint8
    # y * 2.5 and x * 0.4 (as float32); the box below the picture is dropped with its label.
    np.testing.assert_array_equal(rb, np.array([[5, 2, 15, 6], [0, 0, 7.5, 1.2]], np.float32))
    np.testing.assert_array_equal(rl, [1, 3])
    np.testing.assert_allclose(D.resize_bbox(bbox[:1], (10, 20), (25, 8)), [[5, 2, 15, 6]])
    cb, cl = D.clip_bbox(bbox, label, 10, 20)
    np.testing.assert_array_equal(cb, [[2, 5, 6, 15], [0, 0, 3, 3]])
    np.testing.assert_array_equal(cl, [1, 3])
    assert D.fit_size(10, 20, 32, 32) == (16, 32)
    fi, fb, fl = D.resize_detection_to_fit(image, bbox, label, 32, 32, fill=5)
    assert fi.shape == (32, 32, 3) and np.all(fi[16:] == 5)
    np.testing.assert_allclose(fb, [[3.2, 8, 9.6, 24], [0, 0, 4.8, 4.8]], rtol=1e-6)  # times 1.6
    with pytest.raises(ValueError, match=r'resize_detection: .*0 x 5'):
        D.resize_detection(image, bbox, label, 0, 5)
    with pytest.raises(ValueError, match=r'flip_detection: label has shape \(2,\), expected \(3,\)'):
        D.flip_detection(image, bbox, label[:2])
    with pytest.raises(ValueError, match=r'flip_detection: bbox has shape \(12,\)'):
        D.flip_detection(image, bbox.reshape(-1), label)


def test_transformed_detection_dataset_batches_pictures_of_many_sizes(tmp_path):
    pictures = write_synthetic_set(tmp_path)
    base = D.CocoDetectionDataset(str(tmp_path / 'instances.json'), str(tmp_path / 'images'))
    ds = D.TransformedDetectionDataset(base, D.DetectionAugmentOptions(height=32, width=40), seed=7)
    assert len(ds) == 4 and ds.seed == 7
    it = kusari.iterators.SerialIterator(ds, 2, repeat=False, shuffle=False)
    for batch in it:
        for image, bbox, label in batch:
            assert image.shape == (32, 40, 3)
            assert np.all(bbox >= 0) and np.all(bbox[:, 2] <= 32) and np.all(bbox[:, 3] <= 40)
    # Those were the first reads; example(i, 0) repeats them without counting.
    first = ds.example(0, 0)
    assert first[0].shape == (32, 40, 3) and len(pictures.records[0].label) == len(first[2])
    ds.reset_draws()
    np.testing.assert_array_equal(ds[0][1], first[1])
    with pytest.raises(ValueError, match='TransformedDetectionDataset'):
        D.TransformedDetectionDataset(base, D.DetectionAugmentOptions(flip_probability=2.0))
