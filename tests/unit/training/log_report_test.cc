// LogReport (its JSON file, averaged values, keys, triggers, resume) and PrintReport's table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training::extensions {
namespace {

using testing::make_setup;
using testing::MapSerializer;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

// Every iteration's reported values, recorded by a reader that runs before LogReport.
struct Recorder {
  std::vector<std::map<std::string, double>> rows;
  std::shared_ptr<Extension> extension() {
    return make_extension(
        [this](Trainer& t) {
          std::map<std::string, double> row;
          for (const auto& [k, v] : t.observation()) row[k] = v.item<double>();
          row["iteration"] = static_cast<double>(t.updater().iteration());
          rows.push_back(row);
        },
        "Recorder", interval(1, "iteration"));
  }
  double mean(const std::string& key, int64_t first_iteration, int64_t last_iteration) const {
    double sum = 0;
    int n = 0;
    for (const auto& row : rows) {
      const auto it = static_cast<int64_t>(row.at("iteration"));
      if (it >= first_iteration && it <= last_iteration) sum += row.at(key), ++n;
    }
    return sum / n;
  }
};

TEST(LogReportTest, WritesAveragedValuesPerEpoch) {
  const std::string out = testing::fresh_out_dir("log_report");
  auto s = make_setup(out, interval(3, "epoch"), /*n=*/6, /*batch_size=*/2, /*lr=*/0.01);
  Recorder recorder;
  s.trainer->extend(recorder.extension());
  auto log_report = std::make_shared<LogReport>();
  s.trainer->extend(log_report);
  s.trainer->run();

  const nlohmann::json log = read_json(out + "/log");
  ASSERT_TRUE(log.is_array());
  ASSERT_EQ(log.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    const nlohmann::json& entry = log[e];
    EXPECT_TRUE(entry["epoch"].is_number_integer());
    EXPECT_EQ(entry["epoch"].get<int64_t>(), e + 1);
    EXPECT_EQ(entry["iteration"].get<int64_t>(), 3 * (e + 1));
    // x is 0..5 in batches {0,1}, {2,3}, {4,5}: batch means 0.5, 2.5, 4.5.
    EXPECT_DOUBLE_EQ(entry["main/x_mean"].get<double>(), 2.5);
    // The loss changes as the model trains: the entry is the mean of that epoch's three.
    const double expected_loss = recorder.mean("main/loss", 3 * e + 1, 3 * e + 3);
    EXPECT_NEAR(entry["main/loss"].get<double>(), expected_loss, 1e-12);
    EXPECT_GE(entry["elapsed_time"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(log_report->log()[e].at("main/loss"), entry["main/loss"].get<double>());
  }
  EXPECT_NE(recorder.mean("main/loss", 1, 3), recorder.mean("main/loss", 7, 9))
      << "the model should be training";
  // Only the log itself is left in the folder (no temporary files).
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(out))
    files.push_back(f.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"log"});
}

TEST(LogReportTest, KeysTriggerAndLogName) {
  const std::string out = testing::fresh_out_dir("log_report_keys");
  auto s = make_setup(out, interval(6, "iteration"));
  auto log_report =
      std::make_shared<LogReport>(std::vector<std::string>{"main/x_mean", "not/reported"},
                                  interval(2, "iteration"), "log_{iteration}.json");
  s.trainer->extend(log_report);
  s.trainer->run();
  ASSERT_EQ(log_report->log().size(), 3u);
  // Iterations 1-2 see batch means 0.5 and 2.5; 3-4: 4.5 and 0.5; 5-6: 2.5 and 4.5.
  const double expected[] = {1.5, 2.5, 3.5};
  for (int i = 0; i < 3; ++i) {
    const auto& entry = log_report->log()[i];
    EXPECT_EQ(entry.count("main/loss"), 0u);
    EXPECT_EQ(entry.count("not/reported"), 0u);
    EXPECT_DOUBLE_EQ(entry.at("main/x_mean"), expected[i]);
    EXPECT_DOUBLE_EQ(entry.at("iteration"), 2.0 * (i + 1));
  }
  EXPECT_TRUE(std::filesystem::exists(out + "/log_2.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/log_6.json"));
  EXPECT_EQ(read_json(out + "/log_6.json").size(), 3u);
  EXPECT_EQ(read_json(out + "/log_6.json"), nlohmann::json::parse(log_report->log_json()));
}

TEST(LogReportTest, NonFiniteValuesAreWrittenAsNull) {
  const std::string out = testing::fresh_out_dir("log_report_nan");
  auto s = make_setup(out, interval(1, "epoch"));
  s.trainer->extend(make_extension(
      [](Trainer& t) {
        t.observation()["bad"] = Array::full({}, std::nan(""), float64, Device::cpu());
      },
      "nan", interval(1, "iteration"), kPriorityWriter));
  s.trainer->extend(LogReport());
  s.trainer->run();
  const nlohmann::json log = read_json(out + "/log");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_TRUE(log[0]["bad"].is_null());
}

// Trains 3 epochs in one go, and again interrupted after `stop_at` iterations, saved and
// resumed into a fresh trainer: the logs must agree.
void check_resume(int64_t stop_at) {
  const std::string out_a = testing::fresh_out_dir("resume_a");
  auto a = make_setup(out_a, interval(3, "epoch"));
  auto log_a = std::make_shared<LogReport>();
  a.trainer->extend(log_a);
  a.trainer->run();

  const std::string out_b = testing::fresh_out_dir("resume_b");
  auto store = std::make_shared<MapSerializer::Store>();
  {
    auto first = make_setup(out_b, interval(stop_at, "iteration"));
    first.trainer->extend(std::make_shared<LogReport>());
    first.trainer->run();
    MapSerializer saver(store, false);
    first.trainer->serialize(saver);
  }
  EXPECT_TRUE(store->count("extensions/LogReport/_log"));
  EXPECT_TRUE(store->count("extensions/LogReport/_trigger/previous_epoch_detail"));
  auto second = make_setup(out_b, interval(3, "epoch"));
  auto log_b = std::make_shared<LogReport>();
  second.trainer->extend(log_b);
  MapSerializer loader(store, true);
  second.trainer->serialize(loader);
  second.trainer->run();

  ASSERT_EQ(log_b->log().size(), log_a->log().size());
  for (size_t i = 0; i < log_a->log().size(); ++i) {
    for (const char* key : {"epoch", "iteration", "main/loss", "main/x_mean"}) {
      EXPECT_NEAR(log_b->log()[i].at(key), log_a->log()[i].at(key), 1e-12)
          << key << " of entry " << i;
    }
  }
  EXPECT_EQ(read_json(out_b + "/log").size(), 3u);
}

TEST(LogReportTest, ResumeAtAnEpochBoundaryContinuesTheLog) {
  check_resume(6);
}

TEST(LogReportTest, ResumeMidIntervalKeepsThePartialSummary) {
  check_resume(4);
}

// The keys of each entry of a JSON log, in the order the file lists them.
std::vector<std::vector<std::string>> key_orders(const std::string& json_text) {
  std::vector<std::vector<std::string>> orders;
  for (const auto& entry : nlohmann::ordered_json::parse(json_text)) {
    std::vector<std::string> keys;
    for (auto it = entry.begin(); it != entry.end(); ++it) keys.push_back(it.key());
    orders.push_back(keys);
  }
  return orders;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(LogReportTest, KeysKeepChainersInsertionOrder) {
  // Named keys: their order, then epoch, iteration, elapsed_time (Note [LogReport key order]).
  const std::string out = testing::fresh_out_dir("log_report_order_keys");
  auto s = make_setup(out, interval(2, "epoch"));
  s.trainer->extend(LogReport(std::vector<std::string>{"main/x_mean", "main/loss"}));
  s.trainer->run();
  const std::vector<std::string> named = {"main/x_mean", "main/loss", "epoch", "iteration",
                                          "elapsed_time"};
  EXPECT_EQ(key_orders(read_text(out + "/log")),
            (std::vector<std::vector<std::string>>{named, named}));

  // All keys: the model's, then a key first reported at the interval's last iteration (as an
  // Evaluator's are), then epoch, iteration, elapsed_time, then what postprocess adds.
  const std::string out_all = testing::fresh_out_dir("log_report_order_all");
  auto a = make_setup(out_all, interval(2, "epoch"));
  a.trainer->extend(make_extension(
      [](Trainer& t) { t.observation()["a/evaluated"] = Array::full({}, 1.0, float64, Device::cpu()); },
      "late", interval(1, "epoch"), kPriorityWriter));
  auto log_report = std::make_shared<LogReport>();
  log_report->set_postprocess([](LogReport::Entry& e) { e["added"] = 2 * e["epoch"]; });
  a.trainer->extend(log_report);
  a.trainer->run();
  const std::vector<std::string> all = {"main/loss", "main/x_mean", "a/evaluated", "epoch",
                                        "iteration", "elapsed_time", "added"};
  EXPECT_EQ(key_orders(read_text(out_all + "/log")),
            (std::vector<std::vector<std::string>>{all, all}));
  EXPECT_EQ(key_orders(log_report->log_json()), key_orders(read_text(out_all + "/log")));

  // A snapshot keeps the order: a LogReport loaded from it writes the same text.
  auto store = std::make_shared<MapSerializer::Store>();
  MapSerializer saver(store, false);
  log_report->serialize(saver);
  LogReport loaded;
  MapSerializer loader(store, true);
  loaded.serialize(loader);
  EXPECT_EQ(loaded.log_json(), log_report->log_json());
}

TEST(LogReportTest, AnEmptyKeyListIsAnError) {
  EXPECT_TRUE(testing::ThrowsWith<ValueError>(
      [] { LogReport(std::vector<std::string>{}); },
      {"LogReport", "list of keys is empty", "std::nullopt", "every reported key"}));
  EXPECT_NO_THROW(LogReport(std::nullopt));
  EXPECT_NO_THROW(LogReport(std::vector<std::string>{"main/loss"}));
}

TEST(PrintReportTest, PrintsChainersTable) {
  const std::string out = testing::fresh_out_dir("print_report");
  auto s = make_setup(out, interval(2, "epoch"));
  std::ostringstream text;
  s.trainer->extend(LogReport());
  s.trainer->extend(
      PrintReport({"epoch", "iteration", "main/x_mean", "missing"}, "LogReport", text));
  s.trainer->run();
  // Columns are max(10, len(key)) wide, two spaces apart; values as Python's {:g}; no line ends
  // in spaces (the padding after a line's last value is dropped).
  const std::string expected =
      "epoch       iteration   main/x_mean  missing\n"
      "1           3           2.5\n"
      "2           6           2.5\n";
  EXPECT_EQ(text.str(), expected);
}

TEST(PrintReportTest, OwnLogReportAndErrors) {
  auto s = make_setup(testing::fresh_out_dir("print_report_own"), interval(1, "epoch"));
  std::ostringstream text;
  auto own = std::make_shared<LogReport>(std::nullopt, nullptr, "");
  s.trainer->extend(PrintReport({"epoch", "main/loss"}, own, text));
  s.trainer->run();
  ASSERT_EQ(own->log().size(), 1u);
  std::istringstream lines(text.str());
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_EQ(header, "epoch       main/loss");
  EXPECT_NE(row.back(), ' ') << row;
  EXPECT_EQ(row.substr(0, 12), "1           ");
  EXPECT_NEAR(std::stod(row.substr(12)), own->log()[0].at("main/loss"),
              1e-5 * own->log()[0].at("main/loss"));

  auto bad = make_setup(testing::fresh_out_dir("print_report_bad"), interval(1, "epoch"));
  bad.trainer->extend(PrintReport({"epoch"}, "LogReport", text));
  EXPECT_THROW(bad.trainer->run(), ValueError);  // no LogReport registered
  auto wrong = make_setup(testing::fresh_out_dir("print_report_wrong"), interval(1, "epoch"));
  wrong.trainer->extend(FailOnNonNumber(), "LogReport");
  wrong.trainer->extend(PrintReport({"epoch"}, "LogReport", text));
  EXPECT_THROW(wrong.trainer->run(), ValueError);  // not a LogReport
}

}  // namespace
}  // namespace kusari::training::extensions
