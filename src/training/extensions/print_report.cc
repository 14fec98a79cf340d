#include "kusari/training/extensions/print_report.h"

#include <algorithm>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"

namespace kusari::training::extensions {

namespace {

std::string pad_right(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

// Columns are padded to line up; the padding after the last value of a line is dropped.
void trim_right(std::string& s) {
  const size_t end = s.find_last_not_of(' ');
  s.erase(end == std::string::npos ? 0 : end + 1);
}

}  // namespace

PrintReport::PrintReport(std::vector<std::string> entries, std::string log_report,
                         std::ostream& out)
    : entries_(std::move(entries)), log_report_name_(std::move(log_report)), out_(&out) {
  KUSARI_CHECK(!log_report_name_.empty(), ValueError, "PrintReport: the LogReport name is empty");
  for (const std::string& e : entries_) widths_.push_back(std::max<size_t>(10, e.size()));
  for (size_t i = 0; i < entries_.size(); ++i) {
    header_ += (i ? "  " : "") + pad_right(entries_[i], widths_[i]);
  }
  trim_right(header_);
  header_ += "\n";
}

PrintReport::PrintReport(std::vector<std::string> entries, std::shared_ptr<LogReport> log_report,
                         std::ostream& out)
    : PrintReport(std::move(entries), std::string("LogReport"), out) {
  KUSARI_CHECK(log_report, ValueError, "PrintReport: the LogReport is null");
  log_report_ = std::move(log_report);
}

void PrintReport::operator()(Trainer& trainer) {
  const bool terminal = detail::is_terminal(*out_, terminal_);
  if (!header_printed_) {
    *out_ << header_;
    header_printed_ = true;
  }
  LogReport* log_report = log_report_.get();
  if (log_report) {
    (*log_report)(trainer);
  } else {
    log_report = dynamic_cast<LogReport*>(&trainer.get_extension(log_report_name_));
    KUSARI_CHECK(log_report, ValueError, "PrintReport: the trainer's extension '", log_report_name_,
                 "' is not a LogReport");
  }
  const std::vector<LogReport::Entry>& log = log_report->log();
  while (log_len_ < log.size()) print_row(log[log_len_++], terminal);
}

void PrintReport::print_row(const LogReport::Entry& entry, bool terminal) {
  std::string row = terminal ? "\033[J" : "";
  for (size_t i = 0; i < entries_.size(); ++i) {
    auto it = entry.find(entries_[i]);
    if (it == entry.end()) {
      row.append(widths_[i] + 2, ' ');
    } else {
      row += pad_right(detail::format_g(it->second), widths_[i]) + "  ";
    }
  }
  trim_right(row);
  *out_ << row << '\n';
  out_->flush();
}

void PrintReport::serialize(Serializer& s) {
  if (log_report_) log_report_->serialize(*s.child("_log_report"));
}

}  // namespace kusari::training::extensions
