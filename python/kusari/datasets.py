"""Datasets (Chainer's chainer.datasets). Any Python sequence of examples (a list of (x, t)
tuples) is a dataset too, wherever kusari takes one."""

from kusari._kusari.data import (Dataset, ImageFolderDataset, LabeledImageDataset, SubDataset,  # noqa: F401
                                 TupleDataset, concat_examples, get_fashion_mnist, get_mnist, read_image,
                                 split_dataset, split_dataset_random, write_image)
from kusari._kusari.data import transforms  # noqa: F401
# Detection (kusari/datasets/detection.h): examples (image, bbox, label), boxes (y_min, x_min, y_max, x_max).
from kusari._kusari.data import (CocoDetectionDataset, CocoImageRecord, DetectionAugmentOptions,  # noqa: F401
                                 SyntheticDetectionSet, TransformedDetectionDataset, augment_detection, clip_bbox,
                                 fit_size, flip_bbox, flip_detection, make_synthetic_detection_images,
                                 random_flip_detection, resize_bbox, resize_detection, resize_detection_to_fit,
                                 write_coco_detection)



class DatasetMixin(object):
    """A dataset written in Python (Chainer's DatasetMixin): define __len__ and get_example(i)."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.get_example(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if index < 0 or index >= len(self):
            raise IndexError('dataset index out of range')
        return self.get_example(index)

    def __len__(self):
        raise NotImplementedError

    def get_example(self, i):
        raise NotImplementedError
