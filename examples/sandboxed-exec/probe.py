"""The sandboxed-exec example's program: it reports what it can reach, as JSON.

The arguments arrive as JSON on stdin; what it prints on stdout is the tool's result.
"""

import json
import os
import socket
import sys
from pathlib import Path


def network() -> str:
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    except OSError:
        return "unreachable"
    return "reachable"


def main() -> None:
    args = json.load(sys.stdin)
    home = Path(args.get("home", "/home"))
    report = {
        "network": network(),
        "host_home_visible": home.exists() and any(home.iterdir()),
        "environment": sorted(os.environ),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
