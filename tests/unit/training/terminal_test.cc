// When PrintReport and ProgressBar write for a terminal (Note [Terminal output]): the program's
// choice, KUSARI_TERMINAL, MPI / batch launcher variables, then isatty. Standard output is put
// on a pseudo-terminal for the tests that need one, as an MPI launcher does for its ranks.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kusari/training/extensions.h"
#include "kusari/training/terminal.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training {
namespace {

using kusari::testing::ThrowsWith;

const std::vector<std::string> kLauncherVariables = {
    "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",           "PMI_RANK",    "PMI_SIZE",
    "MPI_LOCALRANKID",      "MV2_COMM_WORLD_RANK", "PALS_RANKID", "SLURM_PROCID"};

// Clears KUSARI_TERMINAL, every launcher variable and the program's choice for one test (the
// tests may themselves run under mpiexec), and restores them afterwards.
class TerminalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> names = kLauncherVariables;
    names.push_back("KUSARI_TERMINAL");
    for (const std::string& name : names) {
      const char* v = std::getenv(name.c_str());
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name.c_str());
    }
    set_terminal_output(std::nullopt);
  }
  void TearDown() override {
    set_terminal_output(std::nullopt);
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Standard output on a pseudo-terminal while it lives; read() returns what was written to it.
class PtyStdout {
 public:
  PtyStdout() {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY);
    EXPECT_GE(master_, 0) << "posix_openpt";
    EXPECT_EQ(::grantpt(master_), 0);
    EXPECT_EQ(::unlockpt(master_), 0);
    const int slave = ::open(::ptsname(master_), O_RDWR | O_NOCTTY);
    EXPECT_GE(slave, 0) << "open " << ::ptsname(master_);
    std::cout.flush();
    saved_stdout_ = ::dup(STDOUT_FILENO);
    ::dup2(slave, STDOUT_FILENO);
    ::close(slave);
  }
  ~PtyStdout() {
    restore();
    ::close(master_);
  }
  // Puts the real stdout back and returns everything written to the terminal.
  std::string read() {
    restore();
    std::string text;
    ::fcntl(master_, F_SETFL, ::fcntl(master_, F_GETFL) | O_NONBLOCK);
    char buf[4096];
    for (ssize_t n; (n = ::read(master_, buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(n));
    return text;
  }

 private:
  void restore() {
    if (saved_stdout_ < 0) return;
    std::cout.flush();
    ::dup2(saved_stdout_, STDOUT_FILENO);
    ::close(saved_stdout_);
    saved_stdout_ = -1;
  }
  int master_ = -1;
  int saved_stdout_ = -1;
};

TEST_F(TerminalTest, DetectsAPseudoTerminalOutsideALauncher) {
  EXPECT_FALSE(under_launcher());
  {
    PtyStdout pty;
    EXPECT_TRUE(is_terminal_output(std::cout));
  }
  std::ostringstream file;
  EXPECT_FALSE(is_terminal_output(file)) << "a stream that is not std::cout / std::cerr";
}

TEST_F(TerminalTest, PlainLinesUnderEachLauncher) {
  PtyStdout pty;
  for (const std::string& name : kLauncherVariables) {
    ::setenv(name.c_str(), "0", 1);
    EXPECT_TRUE(under_launcher()) << name;
    EXPECT_FALSE(is_terminal_output(std::cout)) << name << " is set: a rank's pty is no terminal";
    ::unsetenv(name.c_str());
    EXPECT_TRUE(is_terminal_output(std::cout)) << name << " unset again";
  }
}

TEST_F(TerminalTest, EnvironmentVariableOverridesDetection) {
  PtyStdout pty;
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("KUSARI_TERMINAL", "1", 1);
  EXPECT_TRUE(is_terminal_output(std::cout)) << "KUSARI_TERMINAL=1 under a launcher";
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("KUSARI_TERMINAL", "0", 1);
  EXPECT_FALSE(is_terminal_output(std::cout)) << "KUSARI_TERMINAL=0 on a terminal";
  ::setenv("KUSARI_TERMINAL", "auto", 1);
  EXPECT_TRUE(is_terminal_output(std::cout));
  ::setenv("KUSARI_TERMINAL", "", 1);
  EXPECT_TRUE(is_terminal_output(std::cout));
  std::ostringstream file;
  ::setenv("KUSARI_TERMINAL", "1", 1);
  EXPECT_FALSE(is_terminal_output(file)) << "only the standard streams follow KUSARI_TERMINAL";
  ::setenv("KUSARI_TERMINAL", "yes please", 1);
  EXPECT_TRUE(ThrowsWith<ValueError>([] { is_terminal_output(std::cout); },
                                     {"KUSARI_TERMINAL", "'yes please'", "1", "0", "auto"}));
}

TEST_F(TerminalTest, ProgramChoiceOverridesTheEnvironment) {
  PtyStdout pty;
  ::setenv("KUSARI_TERMINAL", "1", 1);
  set_terminal_output(false);
  EXPECT_EQ(terminal_output(), std::optional<bool>(false));
  EXPECT_FALSE(is_terminal_output(std::cout));
  EXPECT_FALSE(is_terminal_output(std::cerr));
  ::setenv("KUSARI_TERMINAL", "0", 1);
  ::setenv("SLURM_PROCID", "0", 1);
  set_terminal_output(true);
  EXPECT_TRUE(is_terminal_output(std::cout));
  std::ostringstream file;
  EXPECT_FALSE(is_terminal_output(file));
  set_terminal_output(std::nullopt);
  EXPECT_EQ(terminal_output(), std::nullopt);
  EXPECT_FALSE(is_terminal_output(std::cout));
}

// Runs a short training with PrintReport and ProgressBar on std::cout; returns what they wrote.
std::string train_printing_to_cout(PtyStdout& pty, const std::string& out_dir) {
  auto s = kusari::testing::make_setup(out_dir, interval(2, "epoch"));
  s.trainer->extend(extensions::LogReport());
  s.trainer->extend(extensions::PrintReport({"epoch", "main/loss"}));
  s.trainer->extend(extensions::ProgressBar(std::nullopt, /*update_interval=*/1));
  s.trainer->run();
  return pty.read();
}

TEST_F(TerminalTest, ReportsWritePlainLinesOnARanksPseudoTerminal) {
  {
    PtyStdout pty;
    const std::string text = train_printing_to_cout(pty, kusari::testing::fresh_out_dir("tty"));
    EXPECT_NE(text.find('\033'), std::string::npos) << "a real terminal gets the escapes:\n" << text;
  }
  {
    ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    PtyStdout pty;
    const std::string text = train_printing_to_cout(pty, kusari::testing::fresh_out_dir("mpi"));
    EXPECT_EQ(text.find('\033'), std::string::npos) << "escapes under mpiexec:\n" << text;
    EXPECT_NE(text.find("main/loss"), std::string::npos) << text;
    EXPECT_NE(text.find("6 iter, 2 epoch / 2 epochs; total 100.00%"), std::string::npos) << text;
  }
}

TEST_F(TerminalTest, PrintReportSetTerminalOverridesDetection) {
  auto s = kusari::testing::make_setup(kusari::testing::fresh_out_dir("print"), interval(2, "epoch"));
  std::ostringstream forced, plain;
  s.trainer->extend(extensions::LogReport());
  s.trainer->extend(extensions::PrintReport({"epoch"}, "LogReport", forced).set_terminal(true),
                    "forced");
  ::setenv("KUSARI_TERMINAL", "1", 1);
  set_terminal_output(true);
  s.trainer->extend(extensions::PrintReport({"epoch"}, "LogReport", std::cout).set_terminal(false),
                    "plain");
  PtyStdout pty;
  s.trainer->run();
  const std::string text = pty.read();
  EXPECT_EQ(text.find('\033'), std::string::npos) << text;
  EXPECT_NE(text.find("epoch"), std::string::npos) << text;
  EXPECT_EQ(forced.str(), "epoch\n\033[J1\n\033[J2\n");
}

}  // namespace
}  // namespace kusari::training
