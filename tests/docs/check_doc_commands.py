#!/usr/bin/env python3
"""Checks every shell command of README.md and docs/*.md against the programs of this build.

Note [Checked doc commands]
A command in the docs that no longer matches its program (a renamed flag, a required argument
left out, a script option that was never there) misleads every reader who copies it. So every
line of every ```sh block, and every line of a bare ``` block that starts like a command, is
checked here (CTest `docs_commands`):

  - a kusari program (an example, a tool or a benchmark of this build, named by its path under a
    build folder, as ./name, or by its bare name) runs with KUSARI_CHECK_ARGS=1: it parses and
    checks its arguments and exits (kusari::only_check_arguments), so GPU and cluster commands
    are checked on a machine without either; with `mpiexec`/`srun`/`kusari-run` in front, the program
    alone (the launcher's own options are its tests' business);
  - the programs of RUN_SMALL also run for real, at small sizes (the flags below replace the
    command's own), one page's commands in order in one scratch folder, when the command needs no
    GPU, no launcher option but -n, at most 3 processes and no placeholder argument: so a
    documented sequence (write an image folder, then train on it) is followed end to end;
  - a script of scripts/ runs with KUSARI_CHECK_ARGS=1, which every script must honour (check its
    arguments, then exit): a script that does not is an error here;
  - every other line (cmake, git, a scheduler, a user's own ./train) is checked by `bash -n`, and a
    path under a build folder must name a program this build has.

  - a `python3` command: `-c CODE` runs; a script of the tree (examples/python/...) runs with
    KUSARI_CHECK_ARGS=1 and must call kusari.only_check_arguments() (train_mnist.py also runs at a
    small size, as its C++ twin); the reader's own script (a bare file name) is checked as shell;
  - every ```python block of a page runs, in order, in one namespace, in the page's scratch
    folder (build/python on PYTHONPATH); the hidden line `<!-- python-context: CODE -->` before a
    block runs CODE first (the names a block uses without defining them);
  - a test program of the build (build/tests/...) must exist; a line of a compound command
    (for ... done) is checked with its whole block by `bash -n`, and a kusari program in it has its
    arguments checked when they hold no shell variable.

The links between the pages are checked too: every relative link names a file of the tree, and
its #anchor a heading of that page (GitHub's rule: lower case, punctuation dropped, spaces made
hyphens).

A block preceded by the hidden line `<!-- doc-commands: fail -->` shows commands that must be
refused: each of its kusari-program lines must exit non-zero in the argument check. One preceded
by `<!-- doc-commands: arguments -->` names files the page only describes: its programs have
their arguments checked and are not run.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Programs run for real at small sizes: {program: ([alias set, value] ..., extra flags)}. A value
# of None drops the flag; a flag not in the command is added.
RUN_SMALL = {
    "train_mnist": ([(("-e", "--epoch"), "1"), (("-u", "--unit"), "50")], ["--noplot"]),
    "make_image_folder": ([(("--train",), "64"), (("--val",), "32")], []),
    "train_imagenet": ([(("-E", "--epoch"), "1"), (("-j", "--loaderjob"), "1")], ["--test", "--noplot"]),
    "train_dcgan": ([(("-e", "--epoch"), "1"), (("--train-size",), "300")], []),
    "train_charlm": ([(("-e", "--epoch"), "1"), (("--lines",), "40"), (("-u", "--unit"), "16")], []),
    "train_a2c": ([(("--steps",), "20"), (("--envs",), "4")], []),
    "train_gpt": ([(("-i", "--iterations"), "10"), (("--eval-interval",), "5"), (("--log-interval",), "5")],
                  ["--noplot"]),
    "make_detection_set": ([(("--train",), "32"), (("--val",), "16")], []),
    "train_detection": ([(("-e", "--epoch"), "1"), (("-b", "--batchsize"), "4"), (("--backbone",), "tiny")], []),
    "train_mnist.py": ([(("-e", "--epoch"), "1"), (("-u", "--unit"), "50")], ["--noplot"]),
}

# Runs a page's ```python blocks (a JSON file of [first line, context, code]) in one namespace.
PYTHON_BLOCK_RUNNER = """
import json, sys, traceback
spec = json.load(open(sys.argv[1], encoding='utf-8'))
ns = {'__name__': '__main__'}
for line, context, code in spec['blocks']:
    try:
        if context:
            exec(compile(context, '%s:%d (python-context)' % (spec['page'], line), 'exec'), ns)
        exec(compile(code, '%s:%d' % (spec['page'], line), 'exec'), ns)
    except BaseException:
        traceback.print_exc()
        print('FAILED %d' % line)
        sys.exit(1)
"""
LAUNCHERS = {"mpiexec", "mpirun", "srun", "kusari-run"}
SCRIPT_CHECK_MARK = "KUSARI_CHECK_ARGS"


def fenced_blocks(path):
    """Yields (first line number, language, lines, marker, python context) of each fenced block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    marker = None
    context = None
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)```(\w*)\s*$", line)
        if m:
            lang = m.group(2)
            start = i + 1
            j = start
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            yield start + 1, lang, lines[start:j], marker, context
            marker = context = None
            i = j + 1
            continue
        hidden = re.match(r"^<!--\s*doc-commands:\s*(\w+)\s*-->\s*$", line.strip())
        python_context = re.match(r"^<!--\s*python-context:\s*(.*?)\s*-->\s*$", line.strip())
        if hidden:
            marker = hidden.group(1)
        elif python_context:
            context = python_context.group(1)
        elif line.strip():
            if not line.strip().startswith("<!--"):
                marker = context = None
        i += 1


def logical_lines(block_lines, first_line):
    """Joins backslash continuations; yields (line number, text without its trailing comment)."""
    buf, start = "", None
    for k, raw in enumerate(block_lines):
        if start is None:
            start = first_line + k
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        text = strip_comment(buf).strip()
        if text:
            yield start, text
        buf, start = "", None


def strip_comment(text):
    """The text before an unquoted ' #' comment."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def looks_like_command(text, programs):
    """For bare ``` blocks (which also show output): does this line start a command?"""
    try:
        words = shlex.split(text)
    except ValueError:
        return False
    if not words:
        return False
    first = words[0]
    if first in LAUNCHERS or first in ("scripts", "cmake", "ctest", "ninja", "sudo"):
        return True
    if first.startswith(("./", "build", "scripts/")):
        return True
    return os.path.basename(first) in programs


class Checker:
    def __init__(self, source, build, work, python):
        self.source = source
        self.build = build
        self.work = work
        self.python = python
        self.programs = self.find_programs()
        self.failures = []
        self.verbose = False
        self.has_cuda = True
        self.counts = {"run": 0, "arguments": 0, "script": 0, "shell": 0, "refused": 0, "python": 0}
        self.has_python = True

    def find_programs(self):
        found = {}
        self.test_programs = {}
        for dirpath, _, files in os.walk(os.path.join(self.build, "tests")):
            if "CMakeFiles" in dirpath:
                continue
            for name in files:
                p = os.path.join(dirpath, name)
                if os.access(p, os.X_OK) and not name.endswith((".sh", ".py", ".cmake")):
                    self.test_programs[os.path.relpath(p, self.build)] = p
        for sub in ("examples", "tools", "bench"):
            root = os.path.join(self.build, sub)
            for dirpath, _, files in os.walk(root):
                if "CMakeFiles" in dirpath:
                    continue
                for name in files:
                    p = os.path.join(dirpath, name)
                    if os.access(p, os.X_OK) and not name.endswith((".sh", ".py", ".cmake")):
                        found.setdefault(name, p)
        return found

    def log(self, where, what, text):
        if self.verbose:
            print(f"{where}: {what}: {text}")

    def fail(self, where, text, why):
        self.failures.append(f"{where}: {text}\n    {why}")

    def run(self, argv, cwd, env_extra, timeout):
        env = dict(os.environ)
        env.update(env_extra)
        try:
            p = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=timeout, text=True, errors="replace")
            return p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
            return 124, out + f"\n(stopped after {timeout} s)"

    def split_command(self, words):
        """(environment assignments, launcher words, program word index) of a command."""
        env = {}
        i = 0
        while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
            k, v = words[i].split("=", 1)
            env[k] = v
            i += 1
        if i < len(words) and words[i] in ("sudo", "time", "exec"):
            i += 1
        launcher = []
        if i < len(words) and os.path.basename(words[i]) in LAUNCHERS:
            launcher.append(words[i])
            i += 1
            # Launcher options: -n N, -np N, --flag value ...; the program is the first word that
            # names a program or a path.
            while i < len(words):
                w = words[i]
                if self.program_of(w) or w.startswith(("./", "/")) or "/" in w:
                    break
                launcher.append(w)
                i += 1
        return env, launcher, i

    def program_of(self, word):
        base = os.path.basename(word)
        return base if base in self.programs else None

    def check_line(self, page, line_no, text, cwd, marker, compound=False):
        where = f"{page}:{line_no}"
        try:
            words = shlex.split(text)
        except ValueError as e:
            self.fail(where, text, f"cannot be split into words: {e}")
            return
        if not words:
            return
        if words[-1] == "&":
            words = words[:-1]
        env, launcher, i = self.split_command(words)
        prog_word = words[i] if i < len(words) else ""
        args = words[i + 1:]
        if re.match(r"^python3(\.\d+)?$", os.path.basename(prog_word)) and not compound:
            self.check_python(where, text, env, launcher, args, cwd, marker)
            return
        test_path = re.sub(r"^(\./)?build[^/]*/", "", prog_word)
        if re.match(r"^(\./)?build[^/]*/tests/", prog_word):
            self.counts["shell"] += 1
            self.log(where, "test program exists", text)
            cuda_only = os.path.basename(test_path) == "kusari_cuda_tests" and not self.has_cuda
            if test_path not in self.test_programs and not cuda_only:
                self.fail(where, text, f"'{prog_word}' names no test program of this build")
            return
        if prog_word.startswith("scripts/") or prog_word.startswith("./scripts/"):
            self.check_script(where, text, prog_word, args, env)
            return
        program = self.program_of(prog_word)
        if program is None:
            if re.match(r"^(\./)?build[^/]*/", prog_word):
                self.fail(where, text, f"'{prog_word}' names no program of this build")
                return
            self.check_shell(where, text, compound)
            return
        gpu = any(a in ("--gpu", "-g") for a in args) or "cuda" in " ".join(args)
        placeholder = any("<" in a or ">" in a for a in args)
        if any("$" in a for a in args):
            self.counts["shell"] += 1  # (a shell variable: the block's syntax is checked)
            return
        self.log(where, "arguments", text)
        code, out = self.run([self.programs[program]] + args, cwd, dict(env, KUSARI_CHECK_ARGS="1"), 60)
        if marker == "fail":
            self.counts["refused"] += 1
            if code == 0:
                self.fail(where, text, "the docs show this command refused, but its arguments were accepted")
            return
        self.counts["arguments"] += 1
        if code != 0 or "arguments accepted" not in out:
            self.fail(where, text, f"the argument check failed (exit status {code}):\n" + indent(out))
            return
        if program not in RUN_SMALL or gpu or placeholder or marker == "arguments":
            return
        np_ = 1
        if launcher:
            opts = launcher[1:]
            if len(opts) != 2 or opts[0] not in ("-n", "-np") or not opts[1].isdigit():
                return  # binding and mapping options are the machine's: arguments checked only
            np_ = int(opts[1])
            if np_ > 3:
                return
        small = small_args(program, args)
        argv = [self.programs[program]] + small
        if launcher:
            argv = [launcher[0], "-n", str(np_)] + self.mpi_flags() + argv
        self.log(where, "run small", " ".join(argv))
        code, out = self.run(argv, cwd, env, 600)
        self.counts["run"] += 1
        if code != 0:
            self.fail(where, text, f"run at a small size as `{' '.join(shlex.quote(a) for a in argv)}`, "
                                   f"it failed (exit status {code}):\n" + indent(out))

    def mpi_flags(self):
        out = subprocess.run(["mpiexec", "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True).stdout
        return ["--oversubscribe"] if ("Open MPI" in out or "OpenRTE" in out) else []

    def check_script(self, where, text, prog_word, args, env):
        path = os.path.join(self.source, prog_word[2:] if prog_word.startswith("./") else prog_word)
        if not os.path.isfile(path):
            self.fail(where, text, f"there is no script {prog_word}")
            return
        with open(path, encoding="utf-8") as f:
            if SCRIPT_CHECK_MARK not in f.read():
                self.fail(where, text, f"{prog_word} does not honour KUSARI_CHECK_ARGS (check its arguments, "
                                       "then exit), so its documented command cannot be checked")
                return
        code, out = self.run(["bash", path] + args, self.source,
                             dict(env, KUSARI_CHECK_ARGS="1", KUSARI_BUILD_DIR=self.build), 60)
        self.counts["script"] += 1
        if code != 0:
            self.fail(where, text, f"the argument check failed (exit status {code}):\n" + indent(out))

    def check_shell(self, where, text, compound=False):
        if compound:
            return  # (checked with its block)
        self.counts["shell"] += 1
        p = subprocess.run(["bash", "-n", "-c", text], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            self.fail(where, text, "not a valid shell command: " + p.stdout.strip())

    def check_page(self, path):
        page = os.path.relpath(path, self.source)
        cwd = os.path.join(self.work, re.sub(r"[^A-Za-z0-9_.-]", "_", page))
        os.makedirs(cwd, exist_ok=True)
        python_blocks = []
        for first, lang, lines, marker, context in fenced_blocks(path):
            if lang == "python" and marker != "arguments":
                python_blocks.append((first, context or "", "\n".join(lines)))
            if lang not in ("sh", "bash", ""):
                continue
            depth = 0
            block_text = []
            for line_no, text in logical_lines(lines, first):
                if lang == "" and not looks_like_command(text, self.programs):
                    continue
                if text.startswith("$ "):
                    text = text[2:]
                block_text.append(text)
                first_word = text.split()[0]
                opens = first_word in ("for", "while", "until", "if", "case")
                closes = first_word in ("done", "fi", "esac")
                if opens or closes or depth > 0:
                    # A line of a compound command: its program (if any) is checked alone, the
                    # syntax with the whole block below.
                    body = re.sub(r"^(do|then|else)\s+", "", text)
                    if not (opens or closes):
                        self.check_line(page, line_no, body, cwd, marker, compound=True)
                    depth += opens - closes
                    continue
                self.check_line(page, line_no, text, cwd, marker)
            if block_text:
                p = subprocess.run(["bash", "-n", "-c", "\n".join(block_text)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
                if p.returncode != 0:
                    self.fail(f"{page}:{first}", "(the block)", "not valid shell: " + p.stdout.strip())
        if python_blocks:
            self.check_python_blocks(page, python_blocks, cwd)

    def python_env(self):
        path = os.path.join(self.build, "python")
        old = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": path + (os.pathsep + old if old else ""), "PYTHONDONTWRITEBYTECODE": "1"}

    def check_python_blocks(self, page, blocks, cwd):
        """Runs a page's ```python blocks in order, in one namespace, in the page's scratch folder."""
        if not self.has_python:
            return
        spec = os.path.join(cwd, "python_blocks.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump({"page": page, "blocks": blocks}, f)
        self.log(page, "python blocks", f"{len(blocks)} blocks")
        code, out = self.run([self.python, "-c", PYTHON_BLOCK_RUNNER, spec], cwd, self.python_env(), 600)
        self.counts["python"] += len(blocks)
        if code != 0:
            where = re.search(r"^FAILED (\d+)$", out, re.M)
            self.fail(f"{page}:{where.group(1) if where else '?'}", "(a python block)",
                      f"it failed (exit status {code}):\n" + indent(out))

    def check_python(self, where, text, env, launcher, args, cwd, marker):
        """A python3 command: -c code runs; a script of the tree has its arguments checked (and
        train_mnist.py runs at a small size); another (the reader's own script) is checked as shell."""
        env = dict(env, **self.python_env())
        if args[:1] == ["-c"] and len(args) >= 2:
            self.counts["python"] += 1
            self.log(where, "python -c", text)
            if self.has_python and not launcher:
                code, out = self.run([self.python] + args, cwd, env, 120)
                if code != 0:
                    self.fail(where, text, f"it failed (exit status {code}):\n" + indent(out))
            return
        module = []
        rest = list(args)
        if rest[:2] == ["-m", "kusari.compat"]:
            module, rest = rest[:2], rest[2:]
        elif rest[:1] == ["-m"] or not rest or not rest[0].endswith(".py"):
            self.check_shell(where, text)
            return
        script = rest[0]
        path = os.path.join(self.source, script)
        if not os.path.isfile(path):
            if "/" in script:
                self.fail(where, text, f"there is no script {script} in the source tree")
            else:
                self.check_shell(where, text)  # (the reader's own script)
            return
        with open(path, encoding="utf-8") as f:
            if "only_check_arguments" not in f.read():
                self.fail(where, text, f"{script} does not call kusari.only_check_arguments(), so its documented "
                                       "command cannot be checked")
                return
        if not self.has_python:
            return
        self.log(where, "python arguments", text)
        code, out = self.run([self.python] + module + [path] + rest[1:], cwd, dict(env, KUSARI_CHECK_ARGS="1"), 60)
        self.counts["arguments"] += 1
        if code != 0 or "arguments accepted" not in out:
            self.fail(where, text, f"the argument check failed (exit status {code}):\n" + indent(out))
            return
        program = os.path.basename(script)
        gpu = any(a in ("--gpu", "-g") for a in rest)
        if program not in RUN_SMALL or gpu or marker == "arguments" or any("$" in a for a in rest):
            return
        np_ = 1
        if launcher:
            opts = launcher[1:]
            if len(opts) != 2 or opts[0] not in ("-n", "-np") or not opts[1].isdigit() or int(opts[1]) > 3:
                return
            np_ = int(opts[1])
        argv = [self.python] + module + [path] + small_args(program, rest[1:])
        if launcher:
            argv = [launcher[0], "-n", str(np_)] + self.mpi_flags() + argv
        self.log(where, "run small", " ".join(argv))
        code, out = self.run(argv, cwd, env, 600)
        self.counts["run"] += 1
        if code != 0:
            self.fail(where, text, f"run at a small size as `{' '.join(shlex.quote(a) for a in argv)}`, "
                                   f"it failed (exit status {code}):\n" + indent(out))


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path):
    out = set()
    counts = {}
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if re.match(r"^\s*```", line):
                in_code = not in_code
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not in_code:
                a = slug(m.group(1))
                n = counts.get(a, 0)
                counts[a] = n + 1
                out.add(a if n == 0 else f"{a}-{n}")
    return out


def check_links(source, pages):
    """Failures of the relative links of `pages` (a missing file or anchor)."""
    failures = []
    cache = {}
    for page in pages:
        in_code = False
        with open(page, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for no, line in enumerate(lines, 1):
            if re.match(r"^\s*```", line):
                in_code = not in_code
                continue
            if in_code:
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
                where = f"{os.path.relpath(page, source)}:{no}"
                if not os.path.exists(dest):
                    failures.append(f"{where}: the link ({target}) names {os.path.relpath(dest, source)}, which does not exist")
                    continue
                if anchor and dest.endswith(".md"):
                    if dest not in cache:
                        cache[dest] = anchors_of(dest)
                    if anchor not in cache[dest]:
                        failures.append(f"{where}: the link ({target}) names the anchor #{anchor}, which "
                                        f"{os.path.relpath(dest, source)} has no heading for")
    return failures


def small_args(program, args):
    """The command's arguments with RUN_SMALL's sizes in place of its own."""
    sets, extra = RUN_SMALL[program]
    out = list(args)
    for aliases, value in sets:
        k = 0
        replaced = False
        while k < len(out):
            a = out[k]
            name = a.split("=", 1)[0]
            if name in aliases:
                if "=" in a:
                    out[k] = f"{name}={value}"
                else:
                    out[k + 1] = value
                replaced = True
            k += 1
        if not replaced:
            out += [aliases[-1], value]
    for flag in extra:
        if flag not in out:
            out.append(flag)
    return out


def indent(text):
    lines = text.strip().split("\n")[-25:]
    return "\n".join("      " + l for l in lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="the source tree (README.md, docs/, scripts/)")
    ap.add_argument("--build", required=True, help="the build folder whose programs the commands name")
    ap.add_argument("--work", help="scratch folder for the runs (default: a new temporary one)")
    ap.add_argument("--python", default=sys.executable, help="the Python interpreter the docs' Python commands use")
    ap.add_argument("--with-python", choices=["ON", "OFF"], default="ON",
                    help="whether this build has the Python package (OFF: Python commands and blocks are not run)")
    ap.add_argument("--verbose", action="store_true", help="print what is done with each command")
    ap.add_argument("--cuda", choices=["ON", "OFF"], default="ON",
                    help="whether this build has the CUDA backend (OFF: its CUDA test program may be absent)")
    ap.add_argument("pages", nargs="*", help="pages to check (default: README.md and docs/*.md)")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    work = a.work or tempfile.mkdtemp(prefix="kusari-doc-commands.")
    os.makedirs(work, exist_ok=True)
    checker = Checker(source, os.path.abspath(a.build), os.path.abspath(work), a.python)
    checker.verbose = a.verbose
    checker.has_cuda = a.cuda == "ON"
    checker.has_python = a.with_python == "ON"
    pages = a.pages or [os.path.join(source, "README.md")] + sorted(
        os.path.join(source, "docs", p) for p in os.listdir(os.path.join(source, "docs")) if p.endswith(".md"))
    for p in pages:
        checker.check_page(os.path.abspath(p))
    link_failures = check_links(source, [os.path.abspath(p) for p in pages])
    checker.failures += link_failures
    c = checker.counts
    print(f"doc commands: {c['run']} run at a small size, {c['arguments']} programs' arguments checked, "
          f"{c['refused']} refusals checked, {c['script']} scripts' arguments checked, "
          f"{c['python']} Python commands and blocks run, {c['shell']} other shell lines checked for syntax; the links of {len(pages)} pages checked")
    if checker.failures:
        print(f"{len(checker.failures)} documented command(s) do not work:\n")
        print("\n".join(checker.failures))
        return 1
    print("every documented command works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
