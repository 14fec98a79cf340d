// Whether the report extensions (PrintReport, ProgressBar) write for a terminal (ANSI escapes,
// a bar redrawn in place) or plain lines for a log file.
//
//   kusari::training::set_terminal_output(false);   // plain lines on std::cout / std::cerr
//   KUSARI_TERMINAL=1 mpiexec -n 2 ./train_mnist     // escapes even under a launcher
#pragma once

#include <optional>
#include <ostream>

namespace kusari::training {

/// Note [Terminal output]
/// PrintReport and ProgressBar write ANSI escapes ("ESC[J", "ESC[4A") only when their stream
/// is a terminal; in a file they would garble the log. isatty() alone is not enough: MPI
/// launchers (Open MPI's mpiexec in particular) give each rank a pseudo-terminal even when the
/// job's output goes to a file, so a rank sees a terminal that is not there. The decision, for
/// std::cout, std::cerr and std::clog, is therefore, first match wins:
///   1. the program's choice, set_terminal_output(true | false);
///   2. the environment variable KUSARI_TERMINAL: "1" terminal, "0" plain lines, "auto" or
///      empty detect (any other value is a ValueError, so a misspelt setting is not ignored);
///   3. plain lines when the process runs under an MPI or batch launcher: any of
///      OMPI_COMM_WORLD_SIZE (Open MPI), PMIX_RANK (PMIx: Open MPI 5, Slurm's --mpi=pmix),
///      PMI_RANK / PMI_SIZE (MPICH's Hydra, Intel MPI, Slurm's PMI-2), MPI_LOCALRANKID
///      (Hydra), MV2_COMM_WORLD_RANK (MVAPICH2), PALS_RANKID (Cray PALS) or SLURM_PROCID
///      (srun) is set;
///   4. isatty() on the stream's descriptor.
/// Any other stream (a file, a string stream) is plain unless the extension's own
/// set_terminal(true) says otherwise; that per-extension setting overrides all of the above.

/// Sets the program-wide choice (rule 1 of Note [Terminal output]): true for terminal output
/// on the standard streams, false for plain lines, std::nullopt to go back to detecting it.
void set_terminal_output(std::optional<bool> terminal);

/// The program-wide choice set by set_terminal_output (std::nullopt: detect).
std::optional<bool> terminal_output();

/// True when the report extensions should write for a terminal on `out`, by the rules of
/// Note [Terminal output] (rules 1 to 4; false for streams other than the standard ones).
bool is_terminal_output(const std::ostream& out);

/// True when an environment variable of an MPI or batch launcher is set (rule 3 of
/// Note [Terminal output]).
bool under_launcher();

}  // namespace kusari::training
