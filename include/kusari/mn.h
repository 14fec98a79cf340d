// Multi-node training (ChainerMN's capabilities): include this header and link kusari_mn.
//
//   auto comm = kusari::mn::create_communicator("naive");      // "pure_nccl" on GPUs
//   auto opt = kusari::mn::create_multi_node_optimizer(std::make_shared<Adam>(), comm);
//   auto train = kusari::mn::scatter_dataset(train_all, *comm, 0, true);
//   auto checkpointer = kusari::mn::create_multi_node_checkpointer("run42", comm);
//
// Model parallelism: kusari::mn::send / recv and the differentiable collectives (functions.h),
// and kusari::mn::MultiNodeChainList (links.h); see docs/model_parallel.md.
#pragma once

#include "kusari/mn/batch_normalization.h"
#include "kusari/mn/checkpoint.h"
#include "kusari/mn/communicator.h"
#include "kusari/mn/dataset.h"
#include "kusari/mn/extensions.h"
#include "kusari/mn/functions.h"
#include "kusari/mn/iterator.h"
#include "kusari/mn/links.h"
#include "kusari/mn/object.h"
#include "kusari/mn/optimizer.h"
#include "kusari/mn/settings.h"
