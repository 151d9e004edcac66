"""An ``exec`` tool program for the tests: what it does depends on its mode, the first
command-line argument or else the ``mode`` argument of the call.

echo    print {"arguments", "env", "cwd"} as JSON
text    print plain text
fail    write "something went wrong: " and the ``reason`` argument (default "disk on fire")
        to stderr and exit with code 3
sleep   start a grandchild, write both pids to ``pids.txt`` in the cwd, sleep (``seconds``,
        default 60)
orphan  start a sleeping grandchild holding stdout, write its pid, exit at once
flood   write ``size`` bytes of "x"; without a size, far more than the stdout cap
daemon  fork twice: a grandchild that calls setsid(), ignores SIGTERM, closes stdio and
        writes its pid to ``daemon.txt`` in the cwd; then sleep (``daemon-exit``: exit)
leak    print $SERVICE_TOKEN as it is, then base64, base64url and hex encoded (one per line)
leak-stderr  write $SERVICE_TOKEN to stderr and exit with code 3
"""

import base64
import json
import os
import signal
import subprocess
import sys
import time


def main() -> None:
    arguments = json.load(sys.stdin)
    mode = sys.argv[1] if len(sys.argv) > 1 else arguments.get("mode", "echo")
    if mode == "echo":
        json.dump({"arguments": arguments, "env": dict(os.environ), "cwd": os.getcwd()}, sys.stdout)
    elif mode == "text":
        print("hello from probe")
    elif mode == "fail":
        reason = arguments.get("reason", "disk on fire")
        print(f"something went wrong: {reason}", file=sys.stderr)
        sys.exit(3)
    elif mode in ("sleep", "orphan"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with open("pids.txt", "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        if mode == "sleep":
            time.sleep(arguments.get("seconds", 60))
        print('"done"')
    elif mode in ("daemon", "daemon-exit"):
        daemonize()
        if mode == "daemon":
            time.sleep(60)
        print('"done"')
    elif mode == "leak":
        raw = os.environ["SERVICE_TOKEN"].encode()
        encoded = [base64.b64encode(raw), base64.urlsafe_b64encode(raw), raw.hex().encode()]
        sys.stdout.buffer.write(b"\n".join([raw, *encoded]))
    elif mode == "leak-stderr":
        sys.stderr.buffer.write(b"cannot log in with " + os.environ["SERVICE_TOKEN"].encode())
        sys.exit(3)
    elif mode == "flood" and "size" in arguments:
        sys.stdout.write("x" * arguments["size"])
    elif mode == "flood":
        chunk = "x" * 65536
        while True:
            sys.stdout.write(chunk)


def daemonize() -> None:
    """The classic double fork; returns in the original process once the daemon runs."""
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # the intermediate child
        if os.fork() == 0:  # the daemon: no parent but the reaper, no group, no stdio
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            with open("daemon.txt", "w") as f:
                f.write(str(os.getpid()))
            os.write(ready_w, b"x")
            while True:
                time.sleep(60)
        os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)  # the daemon wrote its pid
    os.wait()  # the intermediate child


if __name__ == "__main__":
    main()
