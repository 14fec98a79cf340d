"""The model zoo: ResNet-18/34/50/101/152 as torchvision builds them (kusari/models)."""

from kusari._kusari.links.models import ResNet, resnet18, resnet34, resnet50, resnet101, resnet152  # noqa: F401
