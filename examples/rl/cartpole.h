// The environment of examples/rl (the part Gym plays in Python programs): the cart-pole of
// Barto, Sutton & Anderson (1983) as Gym's CartPole-v1 simulates it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "kusari/core/random.h"

// A uniform number in [0, 1) from a kusari generator (its position is saved in snapshots).
inline double uniform(kusari::Generator& g) { return static_cast<double>(g.next_uint64() >> 11) * 0x1.0p-53; }

// The cart-pole of Barto, Sutton & Anderson (1983) with the constants, Euler integration, limits
// and 500-step cap of Gym's CartPole-v1. Reward 1 per step; done when the pole falls, the cart
// leaves the track or the cap is reached (then the environment starts a new episode).
struct CartPole {
  static constexpr int kObs = 4, kActions = 2, kMaxSteps = 500;
  std::array<double, 4> state{};  // x, x_dot, theta, theta_dot
  int steps = 0;
  double ret = 0;  // the return of the episode so far

  void reset(kusari::Generator& g) {
    for (double& s : state) s = uniform(g) * 0.1 - 0.05;
    steps = 0;
    ret = 0;
  }
  // Applies the action (0: push left, 1: push right); returns true when the episode ended.
  bool step(int action) {
    constexpr double gravity = 9.8, masscart = 1.0, masspole = 0.1, total_mass = masscart + masspole;
    constexpr double length = 0.5, polemass_length = masspole * length, force_mag = 10.0, tau = 0.02;
    constexpr double theta_limit = 12.0 * 2.0 * M_PI / 360.0, x_limit = 2.4;
    auto& [x, x_dot, theta, theta_dot] = state;
    const double force = action == 1 ? force_mag : -force_mag;
    const double cos_t = std::cos(theta), sin_t = std::sin(theta);
    const double temp = (force + polemass_length * theta_dot * theta_dot * sin_t) / total_mass;
    const double theta_acc =
        (gravity * sin_t - cos_t * temp) / (length * (4.0 / 3.0 - masspole * cos_t * cos_t / total_mass));
    const double x_acc = temp - polemass_length * theta_acc * cos_t / total_mass;
    x += tau * x_dot;
    x_dot += tau * x_acc;
    theta += tau * theta_dot;
    theta_dot += tau * theta_acc;
    ++steps;
    return std::abs(x) > x_limit || std::abs(theta) > theta_limit || steps >= kMaxSteps;
  }
};
