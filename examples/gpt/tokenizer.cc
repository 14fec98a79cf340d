#include "tokenizer.h"

#include <climits>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "kusari/core/error.h"

#if KUSARI_GPT_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace gpt {

// --- bytes ------------------------------------------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    KUSARI_CHECK(id >= 0 && id < 256, ValueError, "ByteTokenizer: id ", id, " is not a byte");
    out.push_back(static_cast<char>(id));
  }
  return out;
}

// --- GPT-2's byte-level BPE ---------------------------------------------------------------------------

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// The UTF-8 characters of s (each one code point; s is valid UTF-8 made by utf8()).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KUSARI_CHECK(f.good(), IOError, "Gpt2Tokenizer: cannot read ", what, " '", path,
               "' (scripts/get_gpt2_bpe.sh puts GPT-2's encoder.json and vocab.bpe in a folder; give it with "
               "--bpe-dir)");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// GPT-2's pre-tokenizer: contractions, an optional space and a run of letters, of digits, or of
// other non-space symbols, then runs of spaces (keeping the last space for the next word).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

#if KUSARI_GPT_HAVE_PCRE2
struct Gpt2Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};
#else
struct Gpt2Tokenizer::Regex {};
#endif

bool have_gpt2_tokenizer() { return KUSARI_GPT_HAVE_PCRE2 != 0; }

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : regex_(std::make_unique<Regex>()) {
  KUSARI_CHECK(have_gpt2_tokenizer(), NotImplementedError,
               "Gpt2Tokenizer: this build of train_gpt has no PCRE2 (install libpcre2-dev and rebuild), so only "
               "--tokenizer bytes");
  // Bytes to printable characters: the printable Latin-1 bytes stand for themselves, the others
  // (controls, space, ...) for the characters from U+0100 on, in byte order.
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_char_[b] = utf8(printable ? static_cast<uint32_t>(b) : next++);
    char_byte_[byte_char_[b]] = static_cast<uint8_t>(b);
  }
  const std::string encoder_path = dir + "/encoder.json", merges_path = dir + "/vocab.bpe";
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(read_file(encoder_path, "the vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    KUSARI_THROW(IOError, "Gpt2Tokenizer: '", encoder_path, "' is not JSON: ", e.what());
  }
  KUSARI_CHECK(encoder.is_object() && !encoder.empty(), IOError, "Gpt2Tokenizer: '", encoder_path,
               "' is not a JSON object of token -> id");
  decoder_.resize(encoder.size());
  for (const auto& [token, id] : encoder.items()) {
    KUSARI_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                     id.get<int64_t>() < static_cast<int64_t>(encoder.size()),
                 IOError, "Gpt2Tokenizer: '", encoder_path, "' maps '", token, "' to ", id.dump(),
                 ", not an id in [0, ", encoder.size(), ")");
    encoder_[token] = id.get<int32_t>();
    decoder_[id.get<size_t>()] = token;
  }
  std::istringstream merges(read_file(merges_path, "the merges"));
  std::string line;
  int32_t rank = 0;
  while (std::getline(merges, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    KUSARI_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size(), IOError,
                 "Gpt2Tokenizer: line ", rank + 2, " of '", merges_path, "' is not a pair 'left right': '", line, "'");
    ranks_.emplace(line, rank++);
  }
  KUSARI_CHECK(rank > 0, IOError, "Gpt2Tokenizer: '", merges_path, "' has no merges");
#if KUSARI_GPT_HAVE_PCRE2
  int error = 0;
  PCRE2_SIZE offset = 0;
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  KUSARI_CHECK(regex_->code != nullptr, Error, "Gpt2Tokenizer: PCRE2 refused the pattern (error ", error,
               " at ", offset, ")");
#endif
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

// The merges of vocab.bpe on one piece: repeatedly merge the adjacent pair of lowest rank
// (every occurrence of it, left to right) until no pair has a rank.
std::vector<int32_t> Gpt2Tokenizer::encode_piece(const std::string& piece) const {
  auto hit = cache_.find(piece);
  if (hit != cache_.end()) return hit->second;
  std::string mapped;
  for (unsigned char c : piece) mapped += byte_char_[c];
  std::vector<std::string> word = characters(mapped);
  while (word.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto r = ranks_.find(word[i] + " " + word[i + 1]);
      if (r != ranks_.end() && r->second < best) {
        best = r->second;
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    const std::string left = word[at], right = word[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
        merged.push_back(left + right);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& symbol : word) {
    auto e = encoder_.find(symbol);
    KUSARI_CHECK(e != encoder_.end(), ValueError, "Gpt2Tokenizer: the vocabulary has no token for '", symbol,
                 "' (encoder.json and vocab.bpe do not belong together)");
    ids.push_back(e->second);
  }
  if (cache_.size() < (1u << 20)) cache_.emplace(piece, ids);
  return ids;
}

std::vector<int32_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
#if KUSARI_GPT_HAVE_PCRE2
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  PCRE2_SIZE start = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, match,
                               nullptr);
    if (rc < 0) break;  // (no match: the rest is invalid UTF-8 the pattern cannot take)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    if (ov[1] == ov[0]) {  // (an empty match cannot happen with this pattern; step on to be safe)
      ++start;
      continue;
    }
    // Bytes the pattern skipped (invalid UTF-8) are pieces of their own, byte by byte.
    for (PCRE2_SIZE i = start; i < ov[0]; ++i) {
      std::vector<int32_t> b = encode_piece(std::string(1, text[i]));
      ids.insert(ids.end(), b.begin(), b.end());
    }
    std::vector<int32_t> p = encode_piece(text.substr(ov[0], ov[1] - ov[0]));
    ids.insert(ids.end(), p.begin(), p.end());
    start = ov[1];
  }
  for (PCRE2_SIZE i = start; i < text.size(); ++i) {
    std::vector<int32_t> b = encode_piece(std::string(1, text[i]));
    ids.insert(ids.end(), b.begin(), b.end());
  }
  pcre2_match_data_free(match);
#else
  (void)text;
#endif
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    KUSARI_CHECK(id >= 0 && id < vocab_size(), ValueError, "Gpt2Tokenizer: id ", id, " is not in [0, ",
                 vocab_size(), ")");
    for (const std::string& ch : characters(decoder_[static_cast<size_t>(id)])) {
      auto b = char_byte_.find(ch);
      if (b != char_byte_.end()) out.push_back(static_cast<char>(b->second));
    }
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& bpe_dir) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  KUSARI_CHECK(name == "gpt2", ValueError, "train_gpt: unknown tokenizer '", name, "' (bytes or gpt2)");
  return std::make_unique<Gpt2Tokenizer>(bpe_dir);
}

}  // namespace gpt
