// The model zoo: networks built like their reference implementations (torchvision's), ready to
// train or to benchmark. Users often write
//   namespace M = kusari::models;
#pragma once

#include "kusari/models/detection_metrics.h"
#include "kusari/models/faster_rcnn.h"
#include "kusari/models/gpt.h"
#include "kusari/models/resnet.h"
#include "kusari/models/retinanet.h"
