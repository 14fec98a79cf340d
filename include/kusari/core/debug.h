// Debug mode (Chainer's chainer.config.debug): extra checks that cost a device-to-host
// synchronisation, such as validating labels and ids that live on a GPU.
#pragma once

namespace kusari {

/// True when debug mode is on (KUSARI_DEBUG=1 in the environment turns it on at start).
bool is_debug();
/// Turns debug mode on or off for the whole process.
void set_debug(bool on);

}  // namespace kusari
