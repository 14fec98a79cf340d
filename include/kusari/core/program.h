// What a kusari program (an example, a tool, a benchmark, your own) may ask of its environment.
#pragma once

#include <string>

namespace kusari {

/// True when the program was started only to check its arguments: KUSARI_CHECK_ARGS is set (to
/// anything but "" or "0"). Call it once the arguments are parsed and checked; it then prints
/// "<program>: arguments accepted", and main should return 0 without reading data, training or
/// writing anything. The documentation's commands are checked this way on machines that cannot
/// run them (no GPU, no cluster), and a job script can check its command line on a login node
/// before it is queued:
///
///   KUSARI_CHECK_ARGS=1 ./train_imagenet imagenet/train imagenet/val --gpu -B 64   # "arguments accepted"
bool only_check_arguments(const std::string& program);

}  // namespace kusari
