"""Elastic training end to end: an example run with --elastic under kusari-run loses a process and
finishes. --example mnist (train_mnist, the default) or gpt (train_gpt on a generated text).

One case per run (CTest runs each):
  --case kill   rank 1 of 3 is killed (SIGKILL) at a chosen iteration;
  --case stop   rank 2 of 3 is stopped (SIGSTOP) at a chosen iteration, as a frozen node would be;
  --trials N    N runs, each killing a random rank at a random moment, every other one inside one of
                that rank's snapshot writes.
Each run must finish on 2 processes with exit status 0, after exactly the iterations and log
entries of an uninterrupted 3-process run (the same examples seen), a final result within
--tolerance of that run's (test accuracy for mnist, validation loss for gpt), no temporary file
left in the output folder, and (kill and stop) the launcher's log naming the lost rank, its
cause, and the time lost.

  python3 elastic_job.py --launcher kusari-run --program train_mnist --case kill --out DIR \
      [--example mnist] [--mpi-flag=--oversubscribe]

Prints "SKIP: Fashion-MNIST ..." and succeeds when the dataset is not installed.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

RANKS = 3


class Mnist:
    """train_mnist: 2 epochs of 200 iterations (3 processes of 100 examples), a log entry per epoch."""
    name = "mnist"
    metric = "validation/main/accuracy"
    tolerance = 0.005
    expected_log = [1, 2]  # the epochs
    log_key = "epoch"
    needs_data = True
    at_iteration = 130
    snapshot_interval = 25

    def args(self, out):
        return ["--elastic", "-e", "2", "-u", "100", "-b", "100", "--noplot"]


class Gpt:
    """train_gpt: a tiny GPT, 80 iterations of 3 processes x 4 windows of a generated text, a log
    entry every 40 iterations."""
    name = "gpt"
    metric = "validation/main/loss"
    tolerance = 0.1
    expected_log = [40, 80]  # the iterations
    log_key = "iteration"
    needs_data = False
    at_iteration = 35
    snapshot_interval = 10

    def args(self, out):
        corpus = os.path.join(os.path.dirname(os.path.abspath(out)), "corpus.txt")
        if not os.path.exists(corpus):
            with open(corpus, "w") as f:
                for i in range(300):
                    f.write("line %d says %s and then %s.\n" % (i, ["red", "green", "blue"][i % 3],
                                                                ["cats", "dogs", "owls", "fish"][i % 4]))
        return ["--elastic", "--text", corpus, "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size",
                "32", "--seq-len", "32", "-b", "4", "-i", "80", "--eval-interval", "40", "--log-interval", "40",
                "--noplot"]


EXAMPLES = {"mnist": Mnist(), "gpt": Gpt()}


def fail(message):
    sys.exit("FAIL: " + message)


def only_check_arguments():
    """kusari.only_check_arguments's contract without importing kusari (this script drives the
    programs only): with KUSARI_CHECK_ARGS=1 the arguments were checked, and nothing runs."""
    if os.environ.get("KUSARI_CHECK_ARGS") == "1":
        print("arguments accepted")
        return True
    return False


def fashion_mnist_found():
    roots = ["/usr/share/datasets/fashion-mnist"]
    if os.environ.get("KUSARI_DATASET_ROOT"):
        roots.insert(0, os.path.join(os.environ["KUSARI_DATASET_ROOT"], "fashion-mnist"))
    for root in roots:
        for name in ("train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"):
            if os.path.exists(os.path.join(root, name)):
                return True
    print("SKIP: Fashion-MNIST is not installed (looked in %s)" % ", ".join(roots))
    return False


def last_log_entry(example, out):
    with open(os.path.join(out, "log")) as f:
        log = json.load(f)
    logged = [entry[example.log_key] for entry in log]
    if logged != example.expected_log:
        fail("%s/log has the entries of %s %s; expected %s, each once" % (out, example.log_key, logged,
                                                                       example.expected_log))
    return log[-1]


def leftover_temporaries(out):
    return sorted(name for name in os.listdir(out) if ".tmp." in name)


def read_heartbeat(folder, rank):
    try:
        with open(os.path.join(folder, "rank.%d.json" % rank)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def uninterrupted(args, out):
    command = [args.mpiexec, "-n", str(RANKS)] + args.mpi_flag + [args.program] + args.example.args(out) + [
        "--snapshot-interval", str(args.snapshot_interval), "-o", out]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        fail("the uninterrupted run failed (%d): %s\n%s%s" % (run.returncode, " ".join(command), run.stdout,
                                                               run.stderr))
    return last_log_entry(args.example, out)


def writing(out, rank):
    """True while process `rank` writes a snapshot (its temporary file exists)."""
    try:
        return any(name.startswith(".snapshot_iter_") and name.split(".tmp.")[0].endswith(".%d" % rank)
                   for name in os.listdir(out) if ".tmp." in name)
    except OSError:
        return False


def elastic_run(args, out, rank, how, when, during_write=False):
    """Runs the example under kusari-run and hits process `rank` with `how` (a signal) once rank 0's
    heartbeat reaches iteration `when` (an int), or `when` seconds after training started (a float);
    with `during_write`, at the first moment after that when `rank` is writing a snapshot."""
    beats = os.path.join(out, ".kusari-run")
    log = os.path.join(out, "kusari-run.log")
    command = [args.launcher, "-n", "2:%d" % RANKS, "--max-restarts", "1", "--hang-timeout", str(args.hang_timeout),
               "--heartbeat-dir", beats, "--log", log]
    command += ["--mpiexec=%s" % args.mpiexec] + ["--mpiexec-arg=%s" % f for f in args.mpi_flag]
    command += ["--", args.program] + args.example.args(out) + ["--snapshot-interval", str(args.snapshot_interval),
                                                                "-o", out, "-r", out]
    os.makedirs(out, exist_ok=True)
    started = time.time()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    attempt0 = os.path.join(beats, "attempt.0")
    hit_pid = None
    training_since = None
    while job.poll() is None and hit_pid is None:
        if training_since is None or not during_write:
            time.sleep(0.05)
        lead = read_heartbeat(attempt0, 0)
        target = read_heartbeat(attempt0, rank)
        if not lead or not target or lead.get("iteration", -1) < 1:
            if time.time() - started > 120:
                job.kill()
                fail("no heartbeat of training within 120 s: " + " ".join(command))
            continue
        if training_since is None:
            training_since = time.time()
        due = lead["iteration"] >= when if isinstance(when, int) else time.time() - training_since >= when
        if due and during_write and not writing(out, rank):
            time.sleep(0)  # poll again at once: a write lasts a few tens of milliseconds
            continue
        if due:
            hit_pid = target["pid"]
            os.kill(hit_pid, how)
            hit_iteration = lead["iteration"]
    try:
        output, _ = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("kusari-run did not end within 300 s of the %s" % signal.Signals(how).name)
    if hit_pid is None:
        fail("the job ended before process %d could be hit:\n%s" % (rank, output))
    try:
        os.kill(hit_pid, 0)
        os.kill(hit_pid, signal.SIGKILL)
        fail("the %s process %d was still there after the job ended" % (signal.Signals(how).name, hit_pid))
    except ProcessLookupError:
        pass
    if job.returncode != 0:
        fail("kusari-run ended with status %d:\n%s" % (job.returncode, output))
    with open(log) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return output, events, hit_iteration


def check_run(args, out, reference, events, output):
    final = last_log_entry(args.example, out)
    if final["iteration"] != reference["iteration"]:
        fail("the elastic run ended at iteration %d, the uninterrupted one at %d (examples seen differ)\n%s" %
             (final["iteration"], reference["iteration"], output))
    metric = args.example.metric
    gap = abs(final[metric] - reference[metric])
    if gap > args.tolerance:
        fail("final %s %.4f vs %.4f uninterrupted: %.4f apart, more than %.4f" %
             (metric, final[metric], reference[metric], gap, args.tolerance))
    left = leftover_temporaries(out)
    if left:
        fail("temporary files left in %s: %s" % (out, left))
    starts = [e for e in events if e["event"] == "start"]
    if [e["np"] for e in starts] != [RANKS, RANKS - 1]:
        fail("expected attempts of %d then %d processes, got %s\n%s" % (RANKS, RANKS - 1, [e["np"] for e in starts],
                                                                        output))
    return final, gap


def single_case(args, reference):
    out = os.path.join(args.out, args.case)
    shutil.rmtree(out, ignore_errors=True)
    rank, how, cause = (1, signal.SIGKILL, "crashed") if args.case == "kill" else (2, signal.SIGSTOP, "hung")
    output, events, hit = elastic_run(args, out, rank, how, args.at_iteration)
    final, gap = check_run(args, out, reference, events, output)
    ends = [e for e in events if e["event"] == "end"]
    lost = ends[0]["lost"] if ends else []
    if [(e["rank"], e["cause"]) for e in lost] != [(rank, cause)]:
        fail("the launcher's log names the lost ranks %s; expected rank %d, %s\n%s" % (lost, rank, cause, output))
    caught = [e for e in events if e["event"] == "caught_up"]
    if not caught:
        fail("the launcher's log has no caught_up event (the time lost)\n%s" % output)
    # Time lost: the detection (the hang timeout for a stopped process), the iterations since the
    # last snapshot (at most snapshot_interval, well under a few seconds here), and 10 s.
    allowed = (args.hang_timeout if how == signal.SIGSTOP else 0) + args.snapshot_seconds + 10
    if caught[0]["time_lost_s"] > allowed:
        fail("time lost %.1f s, more than %.1f s" % (caught[0]["time_lost_s"], allowed))
    resumed = [e for e in events if e["event"] == "resumed"]
    print("%s %s: rank %d hit at iteration %d, %s; resumed from %s on %d processes; %d iterations as uninterrupted; "
          "%s %.4f (uninterrupted %.4f); time lost %.1f s" %
          (args.example.name, args.case, rank, hit, cause, resumed[0]["resumed_from"] if resumed else "?", RANKS - 1,
           final["iteration"], args.example.metric, final[args.example.metric], reference[args.example.metric],
           caught[0]["time_lost_s"]))
    shutil.rmtree(out, ignore_errors=True)  # (about 50 MB of snapshots; a failed run keeps its folder)


def trials(args, reference):
    rng = random.Random(args.seed)
    gaps, lost_times = [], []
    for k in range(args.trials):
        out = os.path.join(args.out, "trial%02d" % k)
        shutil.rmtree(out, ignore_errors=True)
        rank = rng.randrange(RANKS)
        when = rng.uniform(0.2, args.trial_window)
        during_write = k % 2 == 1  # every other kill lands inside one of the process's snapshot writes
        output, events, hit = elastic_run(args, out, rank, signal.SIGKILL, when, during_write)
        final, gap = check_run(args, out, reference, events, output)
        caught = [e for e in events if e["event"] == "caught_up"]
        lost_times.append(caught[0]["time_lost_s"] if caught else float("nan"))
        gaps.append(gap)
        print("trial %d: rank %d killed %s%.2f s into training (iteration %d); finished at iteration %d, log "
              "entries %s once each, no temporary file; %s %.4f; time lost %.1f s" %
              (k, rank, "while writing a snapshot, after " if during_write else "", when, hit, final["iteration"],
               args.example.expected_log, args.example.metric, final[args.example.metric], lost_times[-1]))
        shutil.rmtree(out, ignore_errors=True)
    print("%d kills (%d during snapshot writes): every run finished with the uninterrupted run's %d iterations "
          "(%s %.4f); largest gap %.4f; time lost %.1f s at most" %
          (args.trials, args.trials // 2, reference["iteration"], args.example.metric, reference[args.example.metric],
           max(gaps), max(lost_times)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--program", required=True, help="the example program (train_mnist or train_gpt)")
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="mnist")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--mpi-flag", action="append", default=[])
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", choices=["kill", "stop"])
    parser.add_argument("--trials", type=int, default=0)
    parser.add_argument("--trial-window", type=float, default=6.0, help="kill within this many seconds of training")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--at-iteration", type=int, default=None, help="default: 130 (mnist), 35 (gpt)")
    parser.add_argument("--snapshot-interval", type=int, default=None, help="default: 25 (mnist), 10 (gpt)")
    parser.add_argument("--snapshot-seconds", type=float, default=5.0,
                        help="an upper bound of the time between snapshots on this machine")
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest gap of the final result (default: 0.005 of accuracy for mnist, 0.1 of loss "
                             "for gpt)")
    args = parser.parse_args()
    if (args.case is None) == (args.trials == 0):
        parser.error("give one of --case or --trials")
    if only_check_arguments():
        return
    args.example = EXAMPLES[args.example]
    if args.tolerance is None:
        args.tolerance = args.example.tolerance
    if args.at_iteration is None:
        args.at_iteration = args.example.at_iteration
    if args.snapshot_interval is None:
        args.snapshot_interval = args.example.snapshot_interval
    if args.example.needs_data and not fashion_mnist_found():
        return
    os.makedirs(args.out, exist_ok=True)
    reference = uninterrupted(args, os.path.join(args.out, "uninterrupted"))
    if args.case:
        single_case(args, reference)
    else:
        trials(args, reference)


if __name__ == "__main__":
    main()
