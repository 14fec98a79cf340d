"""The model zoo (kusari/models): ResNet-18/34/50/101/152 as torchvision builds them, GPT as GPT-2 is
built (124M parameters for gpt2_small, GPT-2's parameter names), and RetinaNet and Faster R-CNN for object
detection with their anchors, matching and mAP evaluation (boxes (y_min, x_min, y_max, x_max), as ChainerCV)."""

from kusari._kusari.links.models import ResNet, resnet18, resnet34, resnet50, resnet101, resnet152  # noqa: F401
from kusari._kusari.links.models import (GPT, GPTConfig, gpt2_medium, gpt2_medium_config, gpt2_small,  # noqa: F401
                                         gpt2_small_config, gpt_tiny_config)
from kusari._kusari.links.models import (ResNetBlock, RetinaNet, RetinaNetLoss, RetinaNetOptions,  # noqa: F401
                                         RetinaNetOutputs, detection_scores, eval_detection, generate_anchors,
                                         match_anchors, retinanet_resnet50_fpn)
from kusari._kusari.links.models import (FasterRCNN, FasterRCNNLoss, FasterRCNNOptions,  # noqa: F401
                                         faster_rcnn_resnet50_fpn, fpn_roi_levels)
