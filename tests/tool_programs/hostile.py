"""A hostile ``exec`` tool program for the isolation tests: it tries what a tool must not.

The call's ``mode`` argument says what; each mode prints a JSON result on stdout.

read      {"paths": [...]}: per path, "read" (and the first bytes) or the errno's name
list      {"paths": [...]}: per directory, its entries or the errno's name
write     {"paths": [...]}: per path, "written" or the errno's name
environ   every /proc/*/environ it can read, searched for {"marker": ...}: the pids found
connect   {"host", "port"}: "connected" or the errno's name
fetch     {"url"}: the body of an HTTP GET
daemon    {"token", "exit"?}: a double-forked setsid() grandchild sleeping with ``token`` in
          its command line; then sleep (with "exit": true, answer "started" at once)
forks     {"count"}: start ``count`` sleeping children; a failed fork is an exit 1
memory    {"mb"}: allocate that many MiB
spin      burn CPU forever
bigfile   {"mb", "path"?}: write a file of that many MiB at path (/tmp/big); with a path,
          a failure is the errno's name
symlink   {"link", "target"}: make ``link`` a symlink to ``target`` (replacing what is there)
environment  {"names": [...]}: the values of those environment variables (null: unset)
"""

import errno
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def _errno(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc))


def read(paths: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, "rb") as f:
                found[path] = "read:" + f.read(64).decode("latin-1")
        except OSError as exc:
            found[path] = _errno(exc)
    return found


def listing(paths: list[str]) -> dict[str, object]:
    found: dict[str, object] = {}
    for path in paths:
        try:
            found[path] = sorted(os.listdir(path))
        except OSError as exc:
            found[path] = _errno(exc)
    return found


def write(paths: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, "w") as f:
                f.write("owned")
            found[path] = "written"
        except OSError as exc:
            found[path] = _errno(exc)
    return found


def environ(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=5):
            return "connected"
    except OSError as exc:
        return _errno(exc) if exc.errno else type(exc).__name__


def daemon(token: str, leave: bool) -> None:
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.set_inheritable(ready_w, True)
            # says it runs once it is the process with ``token`` in its command line
            code = "import os, sys, time; os.write(int(sys.argv[1]), b'x'); time.sleep(300)"
            os.execv(sys.executable, [sys.executable, "-c", code, str(ready_w), token])
        os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.wait()
    if leave:
        return
    while True:
        time.sleep(60)


def forks(count: int) -> None:
    children = []
    for started in range(count):
        try:
            children.append(subprocess.Popen(["sleep", "30"]))
        except OSError as exc:
            print(f"fork failed after {started} children: {exc}", file=sys.stderr)
            sys.exit(1)
    print(json.dumps(len(children)))


def main() -> None:
    args = json.load(sys.stdin)
    mode = args["mode"]
    result: object = None
    if mode == "read":
        result = read(args["paths"])
    elif mode == "list":
        result = listing(args["paths"])
    elif mode == "write":
        result = write(args["paths"])
    elif mode == "environ":
        result = environ(args["marker"])
    elif mode == "connect":
        result = connect(args["host"], args["port"])
    elif mode == "fetch":
        with urllib.request.urlopen(args["url"], timeout=10) as response:
            result = response.read().decode()
    elif mode == "daemon":
        with open("daemon.txt", "w") as f:
            f.write("started")
        daemon(args["token"], bool(args.get("exit")))
        result = "started"
    elif mode == "forks":
        forks(args["count"])
        return
    elif mode == "memory":
        block = bytearray(args["mb"] * 1024 * 1024)
        result = len(block)
    elif mode == "spin":
        while True:
            pass
    elif mode == "bigfile":
        try:
            with open(args.get("path", "/tmp/big"), "wb") as f:
                for _ in range(args["mb"]):
                    f.write(b"x" * 1024 * 1024)
        except OSError as exc:
            if "path" not in args:
                raise
            result = _errno(exc)
        else:
            result = "written"
    elif mode == "symlink":
        if os.path.lexists(args["link"]):
            os.rename(args["link"], args["link"] + ".old")
        os.symlink(args["target"], args["link"])
        result = "linked"
    elif mode == "environment":
        result = {name: os.environ.get(name) for name in args["names"]}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
