// PrintReport: prints chosen entries of LogReport's log as a table (Chainer's
// extensions.PrintReport).
//
//   trainer.extend(extensions::LogReport());
//   trainer.extend(extensions::PrintReport({"epoch", "main/loss", "validation/main/loss",
//                                           "elapsed_time"}));
#pragma once

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/training/extension.h"
#include "kusari/training/extensions/log_report.h"

namespace kusari::training::extensions {

/// Prints a header once, then one row per new LogReport entry. Each column is
/// max(10, len(key)) wide, values are printed like Python's "{:g}" and missing values leave
/// the column blank, exactly as in Chainer.
///
/// Note [PrintReport on a terminal]
/// Chainer writes "\033[J" (erase below the cursor) before each row so that a progress bar
/// drawn below is wiped. kusari writes it only when the output is a terminal, so that a log
/// file (e.g. a batch job's stdout) holds the plain table. "A terminal" follows
/// Note [Terminal output] (kusari/training/terminal.h): under mpiexec or srun the rows are plain
/// even when a rank's stdout is a pseudo-terminal; KUSARI_TERMINAL, set_terminal_output() or
/// this extension's set_terminal() override that.
class PrintReport : public Extension {
 public:
  /// Reads the log of the trainer's extension named `log_report` (a LogReport).
  explicit PrintReport(std::vector<std::string> entries, std::string log_report = "LogReport",
                       std::ostream& out = std::cout);
  /// Uses its own LogReport, which it calls every time it runs (Chainer's LogReport instance).
  PrintReport(std::vector<std::string> entries, std::shared_ptr<LogReport> log_report,
              std::ostream& out = std::cout);

  /// Forces the terminal (true: each row starts with ESC[J) or plain (false) output instead of
  /// detecting it (Note [Terminal output]).
  PrintReport& set_terminal(bool terminal) {
    terminal_ = terminal;
    return *this;
  }

  /// Prints the header (first call) and the log entries not printed yet.
  void operator()(Trainer& trainer) override;
  /// "PrintReport".
  std::string default_name() const override { return "PrintReport"; }
  /// Every iteration: rows appear as soon as LogReport writes them.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  /// Saves or loads its own LogReport (under "_log_report") when it has one.
  void serialize(Serializer& serializer) override;

  /// The header line (with its newline).
  const std::string& header() const { return header_; }

 private:
  void print_row(const LogReport::Entry& entry, bool terminal);

  std::vector<std::string> entries_;
  std::vector<size_t> widths_;
  std::string log_report_name_;
  std::shared_ptr<LogReport> log_report_;
  std::ostream* out_;
  std::optional<bool> terminal_;
  std::string header_;
  bool header_printed_ = false;
  size_t log_len_ = 0;  // log entries already printed
};

}  // namespace kusari::training::extensions
