"""An ``exec`` tool program for the tests: what it does depends on the ``mode`` argument.

echo    print {"arguments", "env", "cwd"} as JSON
text    print plain text
fail    write to stderr and exit with code 3
sleep   start a grandchild, write both pids to ``pids.txt`` in the cwd, sleep
orphan  start a sleeping grandchild holding stdout, write its pid, exit at once
flood   write far more than the stdout cap
"""

import json
import os
import subprocess
import sys
import time


def main() -> None:
    arguments = json.load(sys.stdin)
    mode = arguments.get("mode", "echo")
    if mode == "echo":
        json.dump({"arguments": arguments, "env": dict(os.environ), "cwd": os.getcwd()}, sys.stdout)
    elif mode == "text":
        print("hello from probe")
    elif mode == "fail":
        print("something went wrong: disk on fire", file=sys.stderr)
        sys.exit(3)
    elif mode in ("sleep", "orphan"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with open("pids.txt", "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        if mode == "sleep":
            time.sleep(60)
        print('"done"')
    elif mode == "flood":
        chunk = "x" * 65536
        while True:
            sys.stdout.write(chunk)


if __name__ == "__main__":
    main()
