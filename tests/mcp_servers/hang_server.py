"""An MCP "server" that never answers initialize.

It writes its pid and a child's pid to the file named by ``argv[1]``, then
ignores stdin (even its end) and sleeps, so only a kill stops it.
"""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
print("starting up, please wait...", file=sys.stderr, flush=True)
time.sleep(120)
