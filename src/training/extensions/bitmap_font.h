// A 5x9 bitmap font for ASCII 32..126, drawn for kusari's plots (PlotReport). Internal.
#pragma once

#include <cstdint>

namespace kusari::training::detail {

/// Glyph cell: 5 columns, 9 rows; rows 0-6 hold capitals and digits, rows 7-8 descenders.
inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 9;
/// Horizontal advance and line height of the font at scale 1 (pixels).
inline constexpr int kGlyphAdvance = 6;
inline constexpr int kGlyphCapHeight = 7;

/// The rows of character `c` (bit 4 is the leftmost column); characters outside 32..126
/// are drawn as '?'.
const uint8_t* glyph_rows(char c);

}  // namespace kusari::training::detail
