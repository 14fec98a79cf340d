#!/usr/bin/env python3
"""Checks the elastic launcher kusari-run (tools/kusari_run.cc) end to end:

  kusari_run_test.py --launcher build/tools/kusari-run [--mpiexec mpiexec]

Each case runs the real launcher over the real mpiexec with a small fake MPI program, written
into a scratch folder, that writes heartbeats the way kusari's ranks do (Note [Elastic launcher])
and crashes, stops, fails or finishes as the case asks. The cases: a clean run; a crashed rank
and a hung (stopped) one, each followed by a restart on fewer processes; an error of the program
on every rank (no restart); too few slots left; more losses than --max-restarts; usage errors;
SIGTERM to the launcher. Each case prints one line; the first failure ends the run with exit 1.
Open MPI needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to run as root.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

# The fake rank: a heartbeat every PERIOD seconds for BEATS beats, then "done". Its rank and size
# come from the environment mpiexec gives it (Open MPI's, else MPICH's); the launcher gives the
# folder and the attempt.
FAKE_RANK = r'''
import argparse, json, os, signal, socket, sys, time

p = argparse.ArgumentParser()
p.add_argument('--beats', type=int, default=5)
p.add_argument('--period', type=float, default=0.1)
p.add_argument('--crash', type=int, default=-1)   # this rank SIGKILLs itself after 3 beats
p.add_argument('--stop', type=int, default=-1)    # this rank SIGSTOPs itself after 3 beats
p.add_argument('--fail-all', action='store_true')  # every rank fails after 3 beats
p.add_argument('--every-attempt', action='store_true')  # --crash in every attempt, not only the first
a = p.parse_args()
rank = int(os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK')))
size = int(os.environ.get('OMPI_COMM_WORLD_SIZE', os.environ.get('PMI_SIZE')))
attempt = int(os.environ['KUSARI_RUN_ATTEMPT'])
folder = os.environ['KUSARI_HEARTBEAT_DIR']
resumed_from = 1 if attempt > 0 else -1
iteration = resumed_from


def beat(state, message=''):
    record = dict(rank=rank, size=size, host=socket.gethostname(), pid=os.getpid(), time=time.time(),
                  iteration=iteration, resumed_from=resumed_from, state=state, message=message)
    temp = os.path.join(folder, '.rank.{}.json.tmp'.format(rank))
    with open(temp, 'w') as f:
        json.dump(record, f)
    os.replace(temp, os.path.join(folder, 'rank.{}.json'.format(rank)))


def on_term(sig, frame):
    beat('terminated')
    os._exit(143)


signal.signal(signal.SIGTERM, on_term)
for step in range(a.beats):
    beat('running')
    if step == 3 and (attempt == 0 or a.every_attempt) and rank == a.crash:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 3 and attempt == 0 and rank == a.stop:
        os.kill(os.getpid(), signal.SIGSTOP)
    if step == 3 and a.fail_all:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the failure is the last word
        beat('failed', 'loss is NaN at iteration {}'.format(iteration))
        sys.exit(1)
    time.sleep(a.period)
    iteration += 1
beat('done')
'''


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


class Case:
    """One run of the launcher in a scratch folder of its own."""

    def __init__(self, root, name):
        self.folder = os.path.join(root, name)
        os.makedirs(self.folder)
        self.heartbeats = os.path.join(self.folder, 'hb')
        self.log_path = os.path.join(self.folder, 'kusari-run.log')  # the default: beside hb/

    def command(self, options, fake_args=()):
        return ([ARGS.launcher, '--heartbeat-dir', self.heartbeats, '--mpiexec', ARGS.mpiexec] +
                ARGS.mpiexec_args + list(options) + ['--', sys.executable, FAKE] + list(fake_args))

    def run(self, options, fake_args=(), timeout=40):
        p = subprocess.run(self.command(options, fake_args), cwd=self.folder, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        self.output = p.stdout
        return p.returncode

    def events(self, kind=None):
        with open(self.log_path) as f:
            events = [json.loads(line) for line in f]
        return [e for e in events if kind is None or e['event'] == kind]

    def describe(self):
        return '\n--- launcher output:\n' + self.output


def process_is_gone(pid):
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'  # a zombie has ended
    except FileNotFoundError:
        return True


def case_clean(c):
    rc = c.run(['--np', '3'])
    check(rc == 0, 'exit status {}, expected 0'.format(rc) + c.describe())
    starts = c.events('start')
    check(len(starts) == 1 and starts[0]['np'] == 3, 'expected one start on 3 processes, got {}'.format(starts))
    check(starts[0]['hosts'] == {'localhost': 3}, 'hosts {}, expected localhost: 3'.format(starts[0]['hosts']))
    finished = c.events('finished')
    check(len(finished) == 1 and finished[0]['restarts'] == 0, 'expected finished, 0 restarts: {}'.format(finished))
    end = c.events('end')[0]
    check(end['exit_status'] == 0 and end['last_iteration'] == 4, 'end event {}'.format(end))
    return 'one attempt, exit 0'


def case_crash(c):
    rc = c.run(['--np', '2:3'], ['--crash', '1', '--beats', '12'])
    check(rc == 0, 'exit status {}, expected 0'.format(rc) + c.describe())
    starts = c.events('start')
    check([s['np'] for s in starts] == [3, 2], 'attempts on {}, expected 3 then 2'.format(starts) + c.describe())
    lost = c.events('end')[0]['lost']
    check(len(lost) == 1 and lost[0]['rank'] == 1 and lost[0]['cause'] == 'crashed' and lost[0]['host'] == 'localhost',
          'lost {}, expected rank 1 crashed on localhost'.format(lost) + c.describe())
    check(lost[0]['pid'] is not None, 'lost rank without its pid: {}'.format(lost))
    resumed = c.events('resumed')
    check(len(resumed) == 1 and resumed[0]['attempt'] == 1 and resumed[0]['resumed_from'] == 1,
          'resumed events {}'.format(resumed))
    caught = c.events('caught_up')
    check(len(caught) == 1 and caught[0]['attempt'] == 1 and caught[0]['time_lost_s'] > 0 and
          caught[0]['iteration'] == c.events('end')[0]['last_iteration'],
          'caught_up events {}'.format(caught) + c.describe())
    check(c.events('finished')[0]['restarts'] == 1, 'expected 1 restart')
    return 'rank 1 crashed; restarted on 2, exit 0'


def case_hang(c):
    start = time.monotonic()
    rc = c.run(['--np', '2:3', '--hang-timeout', '3'], ['--stop', '2', '--beats', '50'])
    check(rc == 0, 'exit status {}, expected 0'.format(rc) + c.describe())
    hangs = c.events('hang')
    check(len(hangs) == 1 and hangs[0]['rank'] == 2 and hangs[0]['attempt'] == 0 and hangs[0]['heartbeat_age_s'] > 3,
          'hang events {}'.format(hangs) + c.describe())
    end = c.events('end')[0]
    check([(l['rank'], l['cause']) for l in end['lost']] == [(2, 'hung')],
          'lost {}, expected rank 2 hung'.format(end['lost']) + c.describe())
    check([s['np'] for s in c.events('start')] == [3, 2], 'expected attempts on 3 then 2' + c.describe())
    pid = end['lost'][0]['pid']
    check(process_is_gone(pid), 'the stopped rank (pid {}) is still there'.format(pid))
    return 'rank 2 hung; ended after {:.1f} s in all, restarted on 2, pid {} gone'.format(time.monotonic() - start, pid)


def case_program_error(c):
    rc = c.run(['--np', '3'], ['--fail-all', '--beats', '10'])
    check(rc != 0, 'exit status 0, expected a failure' + c.describe())
    check(len(c.events('start')) == 1, 'restarted after a program error' + c.describe())
    check('failed: loss is NaN at iteration 2' in c.output, 'the message is not printed' + c.describe())
    check('not a lost rank: not restarting' in c.output, 'no reason printed' + c.describe())
    failed = c.events('end')[0]['failed']
    check(failed and all(f['message'] == 'loss is NaN at iteration 2' for f in failed), 'failed {}'.format(failed))
    return 'no restart, exit {}'.format(rc)


def case_too_few(c):
    rc = c.run(['--np', '3:3'], ['--crash', '1', '--beats', '12'])
    check(rc != 0, 'exit status 0, expected a failure' + c.describe())
    check('only 2 process slots are left' in c.output and 'at least 3' in c.output,
          'no message about the slots' + c.describe())
    check(len(c.events('start')) == 1, 'restarted with too few slots' + c.describe())
    return 'stopped with 2 slots < 3, exit {}'.format(rc)


def case_max_restarts(c):
    rc = c.run(['--np', '1:3', '--max-restarts', '1'], ['--crash', '1', '--every-attempt', '--beats', '12'])
    check(rc != 0, 'exit status 0, expected a failure' + c.describe())
    check('gave up after 1 restart' in c.output, 'no message about giving up' + c.describe())
    check([s['np'] for s in c.events('start')] == [3, 2], 'expected attempts on 3 then 2' + c.describe())
    return 'gave up after 1 restart, exit {}'.format(rc)


def case_usage(c):
    missing = os.path.join(c.folder, 'no-such-hostfile')
    for options, expected in [(['--np', '0'], "--np '0'"), (['--np', '3:2'], "--np '3:2'"),
                              (['--np', 'x'], "--np 'x'"),
                              (['--np', '2', '--hostfile', missing], "--hostfile '{}'".format(missing))]:
        rc = c.run(options)
        check(rc == 2 and expected in c.output, '{}: exit {}, expected 2 and a message naming {}'.format(
            ' '.join(options), rc, expected) + c.describe())
    p = subprocess.run([ARGS.launcher, '--np', '2'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode == 2 and 'no program' in p.stdout, 'no program: exit {}: {}'.format(p.returncode, p.stdout))
    return '--np 0, --np 3:2, --np x, a missing hostfile, no program: exit 2'


def case_sigterm(c):
    launcher = subprocess.Popen(c.command(['--np', '3'], ['--beats', '400']), cwd=c.folder, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        beats = [os.path.join(c.heartbeats, 'attempt.0', 'rank.{}.json'.format(r)) for r in range(3)]
        deadline = time.monotonic() + 15
        while not all(os.path.exists(b) for b in beats) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = []
        for b in beats:
            with open(b) as f:
                pids.append(json.load(f)['pid'])
        launcher.send_signal(signal.SIGTERM)
        c.output, _ = launcher.communicate(timeout=15)
    finally:
        if launcher.poll() is None:
            launcher.kill()  # (its mpiexec gets SIGTERM when it dies: Note [Elastic launcher])
            launcher.wait()
    check(launcher.returncode == 128 + signal.SIGTERM, 'exit status {}, expected {}'.format(
        launcher.returncode, 128 + signal.SIGTERM) + c.describe())
    check(len(c.events('start')) == 1 and len(c.events('stopped')) == 1, 'expected one start and a stop' + c.describe())
    time.sleep(0.5)
    left = [pid for pid in pids if not process_is_gone(pid)]
    check(not left, 'ranks still running after SIGTERM: {}'.format(left))
    return 'job ended, exit 143, no restart'


CASES = [('a clean run', case_clean), ('b crashed rank', case_crash), ('c hung rank', case_hang),
         ('d program error', case_program_error), ('e too few slots', case_too_few),
         ('f max restarts', case_max_restarts), ('g usage errors', case_usage), ('h SIGTERM', case_sigterm)]


def main():
    global ARGS, FAKE
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--launcher', required=True, help='the kusari-run program')
    parser.add_argument('--mpiexec', default=os.environ.get('KUSARI_MPIEXEC') or os.environ.get('MPIEXEC') or
                        'mpiexec', help='the mpiexec the launcher runs (default: $KUSARI_MPIEXEC, $MPIEXEC)')
    ARGS = parser.parse_args()
    ARGS.launcher = os.path.abspath(ARGS.launcher)
    # 3 processes on a machine that may have fewer cores: Open MPI must be told it may.
    version = subprocess.run([ARGS.mpiexec, '--version'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True).stdout
    ARGS.mpiexec_args = ['--mpiexec-arg=--oversubscribe'] if ('Open MPI' in version or 'OpenRTE' in version) else []
    with tempfile.TemporaryDirectory(prefix='kusari_run_test.') as root:
        FAKE = os.path.join(root, 'fake_rank.py')
        with open(FAKE, 'w') as f:
            f.write(FAKE_RANK)
        start = time.monotonic()
        for name, case in CASES:
            t = time.monotonic()
            try:
                result = case(Case(root, name.split()[0]))
            except (Failure, subprocess.TimeoutExpired, OSError, ValueError, KeyError, IndexError) as e:
                print('FAIL ({}): {}'.format(name, e))
                sys.exit(1)
            print('ok   ({}): {} [{:.1f} s]'.format(name, result, time.monotonic() - t), flush=True)
        print('all {} cases passed in {:.1f} s'.format(len(CASES), time.monotonic() - start))


if __name__ == '__main__':
    main()
