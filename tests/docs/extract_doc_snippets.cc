// Writes every ```cpp block of a Markdown page into one C++ file, so that the doc_snippets
// target compiles them (the test docs_snippets_compile; see CMakeLists.txt beside this file).
//
//   extract_doc_snippets <page.md> <name shown in errors, e.g. docs/training.md> <out.cc>
//
// Note [Compiled doc snippets]
// Each block becomes its own namespace, and #line directives make a compiler error name the
// page and line of the snippet. By default a block is a function body: #include lines are
// moved to the top of the file, and unindented namespace aliases and using-declarations to the
// page's scope, so later blocks of the page see them. A block that defines `int main` (renamed
// so that several pages fit one library) or that is preceded by the hidden comment
// `<!-- snippet: namespace-scope -->` is compiled at namespace scope instead. A hidden comment
// `<!-- snippet-context: DECLARATIONS -->` before a block puts DECLARATIONS (C++ statements,
// never rendered) before its body, for names the prose describes but the block does not
// define. Every block also sees the names of tests/docs/doc_snippet_context.h (model, device,
// trainer, comm, ...). Blocks in other languages (```sh, ```text) are not compiled.
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Line {
  int number;  // 1-based line of the page
  std::string text;
};

struct Block {
  std::vector<Line> lines;
  std::vector<std::string> context;
  bool namespace_scope = false;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: extract_doc_snippets <page.md> <shown name> <out.cc>\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "extract_doc_snippets: cannot read " << argv[1] << "\n";
    return 1;
  }
  const std::string shown = argv[2];
  std::vector<Block> blocks;
  Block pending;  // directives seen before the next fence
  bool in_cpp = false, in_other = false;
  int number = 0;
  const std::regex context_re(R"(^<!--\s*snippet-context:(.*)-->$)");
  const std::regex namespace_scope_re(R"(^<!--\s*snippet:\s*namespace-scope\s*-->$)");
  for (std::string raw; std::getline(in, raw);) {
    ++number;
    const std::string line = trim(raw);
    if (in_cpp) {
      if (starts_with(line, "```")) {
        in_cpp = false;
        blocks.push_back(std::move(pending));
        pending = Block{};
      } else {
        pending.lines.push_back({number, raw});
      }
      continue;
    }
    if (in_other) {
      if (starts_with(line, "```")) in_other = false;
      continue;
    }
    std::smatch m;
    if (line == "```cpp" || line == "```c++") {
      in_cpp = true;
    } else if (starts_with(line, "```")) {
      in_other = true;
      pending = Block{};
    } else if (std::regex_match(line, m, context_re)) {
      pending.context.push_back(trim(m[1].str()));
    } else if (std::regex_match(line, namespace_scope_re)) {
      pending.namespace_scope = true;
    } else if (!line.empty()) {
      pending = Block{};  // directives apply to the block right after them
    }
  }
  if (in_cpp) {
    std::cerr << shown << ": a ```cpp block is not closed\n";
    return 1;
  }

  const std::regex main_re(R"(\bint\s+main\s*\()");
  const std::regex hoist_re(R"(^(namespace\s+\w+\s*=|using\s)[^{}]*;\s*(//.*)?$)");
  std::vector<std::string> includes;
  std::ostringstream page_scope, body;
  int index = 0;
  for (Block& block : blocks) {
    ++index;
    bool has_main = false;
    for (const Line& l : block.lines) has_main = has_main || std::regex_search(l.text, main_re);
    const bool at_namespace_scope = block.namespace_scope || has_main;
    for (Line& l : block.lines) {
      const std::string t = trim(l.text);
      if (starts_with(t, "#include")) {
        includes.push_back(t);
        l.text.clear();
      } else if (!at_namespace_scope && std::regex_match(l.text, hoist_re)) {
        page_scope << "#line " << l.number << " " << quoted(shown) << "\n" << l.text << "\n";
        l.text.clear();
      } else if (has_main) {
        l.text = std::regex_replace(l.text, main_re, "int snippet_main(");
      }
    }
    body << "namespace block_" << index << " {\n";
    if (!at_namespace_scope) body << "[[maybe_unused]] void snippet() {\n";
    for (const std::string& c : block.context) body << c << "\n";
    if (!block.lines.empty()) {
      body << "#line " << block.lines.front().number << " " << quoted(shown) << "\n";
    }
    for (const Line& l : block.lines) body << l.text << "\n";
    if (!at_namespace_scope) body << "}\n";
    body << "}  // namespace block_" << index << "\n";
  }

  std::ofstream out(argv[3]);
  out << "// Generated by extract_doc_snippets from " << shown << " (" << blocks.size()
      << " blocks): compiled by the docs_snippets_compile test, never run. Do not edit.\n";
  if (!blocks.empty()) {
    out << "#include \"doc_snippet_context.h\"\n";
    for (const std::string& inc : includes) out << inc << "\n";
    out << "namespace doc_snippets {\nusing namespace doc_snippet_context;\n";
    out << page_scope.str() << body.str() << "}  // namespace doc_snippets\n";
  }
  return out ? 0 : 1;
}
