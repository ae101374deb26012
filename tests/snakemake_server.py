"""Snakemake commands for the test suite, each in its own process, without paying Snakemake's
imports each time.

`python -m snakemake` spends about 1.8 s of CPU importing Snakemake's command line (its API,
scheduler, persistence and every installed executor plugin, the SLURM one pulling in pandas)
before it reads the Snakefile; the suite runs about a hundred such commands. This server, one
per test process (`wfutil.run_snakemake` starts it), imports `snakemake.cli` once and runs
each command it is sent in a child forked from itself: a new process, in the command's
directory and environment, with `sys.argv` and `sys.path[0]` as `python -m snakemake` there
would have them, its output in the files it is given, ending as the interpreter ends (non-daemon
threads joined, atexit handlers run). What the child runs is Snakemake's own `main`, as
`python -m snakemake` runs it. Nothing of the project is imported here: the Snakefile's imports
(`oattn_lib`) happen in the child, from the command's directory first, as they would.

The server holds no threads when it forks (it only reads requests and waits), so forking is safe.
Protocol, one JSON object per line: a request {"args", "cwd", "env", "stdout", "stderr"} on
stdin; the replies {"pid": ...} once the child runs (a caller that times out kills the child's
process group) and {"rc": ..., "cpu_s": ...} when it has ended, on stdout.
"""
import json
import os
import sys
import traceback

import snakemake.cli


def _child(req: dict) -> None:
    code = 1
    try:
        os.setpgrp()  # a caller that times out kills the command and its jobs together
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False, buffering=1)
        sys.stderr = open(2, "w", closefd=False, buffering=1)
        sys.argv = [snakemake.cli.__file__.replace("cli.py", "__main__.py"), *req["args"]]
        sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
        try:
            snakemake.cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        import atexit
        import threading
        threading._shutdown()  # what the interpreter does at exit: join the non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        print(json.dumps({"pid": pid}), flush=True)
        _, status, usage = os.wait4(pid, 0)
        # the child's CPU, with its own waited-for children's (the jobs): the caller counts it
        # as its own, as it counts a subprocess it waited for
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}),
              flush=True)


if __name__ == "__main__":
    serve()
